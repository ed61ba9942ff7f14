from partkeeper.cli import main

raise SystemExit(main())

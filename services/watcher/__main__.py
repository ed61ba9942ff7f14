from services.watcher.main import main

raise SystemExit(main())

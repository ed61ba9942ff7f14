"""`python -m services.allocator`: run the allocator in the foreground."""

from services.allocator.main import main

raise SystemExit(main())

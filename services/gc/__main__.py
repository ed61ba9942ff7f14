"""`python -m services.gc`: run the GC in the foreground."""

import sys

from services.gc.main import main

sys.exit(main())

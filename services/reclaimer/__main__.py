"""`python -m services.reclaimer`: run the reclaimer in the foreground."""

import sys

from services.reclaimer.main import main

sys.exit(main())

"""``python -m spectrace.cli``."""

import sys

from spectrace.cli import main

sys.exit(main())

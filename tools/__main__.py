"""`python -m tools` runs the `dstore` command line."""

import sys

from tools.cli import main

sys.exit(main())

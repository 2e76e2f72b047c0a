"""`python -m dstore.tools` runs the `dstore` command line."""

import sys

from dstore.tools.cli import main

sys.exit(main())

"""`python -m topoctl.cli`: the same as the `topoctl` command."""

import sys

from topoctl.cli import main

sys.exit(main())

"""`python -m bench.demo`: the demo's program (`bench.demo.run`)."""

import sys

from bench.demo.run import main

sys.exit(main())

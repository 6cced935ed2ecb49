"""Measured AllReduce on a lab: gloo's default vs a ring in the best order vs packed trees.

    .venv/bin/python bench/allreduce_lab.py --lab plans/tworack8-cluster.yaml [--scale 0.25]

Same as ``topoctl bench allreduce`` (``topoctl.bench_allreduce``); see docs/trees.md.
"""

import sys

from topoctl.bench_allreduce import main

if __name__ == "__main__":
    sys.exit(main())

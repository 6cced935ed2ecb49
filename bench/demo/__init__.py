"""`make demo` (`python -m bench.demo`, `run`): every strategy planned, applied and trained in a
lab; its OVS row (`ovs`), the rows' plan summaries (`summary`) and the median of several runs
(`median`)."""

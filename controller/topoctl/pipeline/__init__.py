"""Pipeline parallelism's iteration model for the simulator: `gpipe` (GPipe's schedule over
stages of replicas, the lab's costs) used by every planner of pipelines (the ``placement`` and
``pipeline`` strategies, TAG, bench/)."""

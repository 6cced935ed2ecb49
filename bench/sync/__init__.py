"""Benchmarks of gradient synchronisation beyond the AllReduce: DisCo's buckets (`disco`),
operator fusion's cost model (`fusion_costmodel`), SFB against the AllReduce by batch
(`sfb_crossover`)."""

"""TAG's evaluations: against every strategy in the simulator (`sim`), generalisation of the
prior (`generalise`), against the exhaustive optimum (`small`), deep anchors (`deep_anchors`),
planning time on every example (`examples`)."""

"""What the planner and the training runtime must agree on, written once and imported by both:
the tree schedule file (`schedule`) and the rules of the tree runtime's pipelining (`trees`).
Import-light: no torch, nothing of the controller or the runtime."""

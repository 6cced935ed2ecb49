"""Benchmarks of the namespace lab itself: `lab up`/`down` time (`updown`), cable shaping
accuracy (`shaping`), a rank's CPU share (`cpu_share`), the cable emulation's cost per byte
(`emulation_fit`)."""

"""Collective-communication algorithms (pure functions over plain data)."""

"""Verification math (pure functions) and the one decode loop."""

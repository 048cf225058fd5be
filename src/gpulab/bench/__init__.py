"""Kernel benchmark matrices: one registry of implementations per op, checked then timed."""

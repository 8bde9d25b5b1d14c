"""Rendering for the terminal: the live view (and, later, every table and the one output sink)."""

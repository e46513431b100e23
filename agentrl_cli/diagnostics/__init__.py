"""Diagnostics (METHODS.md §7): audit tree, critic ranking, variance decomposition, tool-call trends."""

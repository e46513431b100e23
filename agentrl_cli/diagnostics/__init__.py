"""Diagnostics (docs/methods.md): audit tree, critic ranking, variance decomposition, tool-call trends."""

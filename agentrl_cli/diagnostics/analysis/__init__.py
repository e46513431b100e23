"""Analyses of past runs (`agentrl diagnose table | tool-call-table | tree-info |
episode-stats`, docs/diagnostics.md): they read run folders through `reporting.run_reader`."""

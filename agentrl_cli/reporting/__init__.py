"""Reporting: metrics.jsonl, rich tables and live display, matplotlib plots."""

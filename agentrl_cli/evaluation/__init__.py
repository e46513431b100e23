"""Evaluation runner and reports."""

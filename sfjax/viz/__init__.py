"""Figures from the files runs, studies and pipelines write (matplotlib)."""

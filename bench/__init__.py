"""Benchmarks: scripts that print figures side by side in one run (see bench/README.md)."""

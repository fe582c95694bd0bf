"""The fault matrix: one test per fault, each with N sessions mid-turn and a documented expected outcome.

Runs with the rest of the suite (N small, `CORRAL_CHAOS_N`, default 2) and from `bench/reliability.py` with a larger
N, which reads the outcome every test records (`matrix.record`) into `bench/results/reliability.md`."""

"""Benchmarks: whole scripts that print a table (run as ``python -m bench.<name>``).

They measure speed and memory; tests never do. Results go, with the machine and
date, in docs/benchmarks.md. Shared traces are read from ``../shared`` beside
the project root; a benchmark that cannot find them says so and exits non-zero.
"""

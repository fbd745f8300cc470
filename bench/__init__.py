"""Benchmarks: whole scripts that print a table (run as ``python -m bench.<name>``).

They measure speed and memory; tests never do. Each measurement goes, with the
machine, date and command, in docs/benchmarks-history.md, and the benchmark's
current figure in docs/benchmarks.md (by hand). Shared traces are read from
``../shared`` beside the project root; a benchmark that cannot find them says
so and exits non-zero.
"""

"""Executors carry out the scheduler's decisions: start, pause and stop workloads."""

"""Wiring: the one place that chooses a backend and puts service, HTTP API and runtime file together."""

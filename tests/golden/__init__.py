"""The golden decision test's scenarios, their rendering and their expected decisions (tests/test_golden_decisions.py)."""

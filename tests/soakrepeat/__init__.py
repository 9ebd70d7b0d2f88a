"""`SOAK_REPEAT=N make soak-repeat`: each named chaos scenario of the e2e run N times, one pytest run per
scenario (one node start for all its repetitions), and a table scenario x passes/N (issue 19 item 2).

- scenarios.py: the named scenarios, each one pytest node ID of tests/e2e (the one list).
- plugin.py: the pytest plugin that repeats the selected test and writes one JSON line per run.
- report.py: those lines read back, the table and the failures.
- __main__.py: the runner (`python -m tests.soakrepeat`).
"""

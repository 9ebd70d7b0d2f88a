"""`make soak`: a seeded random churn on one local node, with the node's invariants checked after
every step (issue 19).

plan.py draws the operations from the seed alone (a replay gets the same sequence); ops.py performs
them on a tests/e2e LocalNode; snapshot.py reads what the invariants look at (vgpud's debug state, the
manager dir, the CDI dir, the checkpoint, the API's pods and claims, vgpud's fds and RSS);
invariants.py judges a snapshot with pure functions; runner.py runs the loop and prints the report;
`python -m tests.soak` is what `make soak` calls (SOAK_N, SOAK_SEED, SOAK_TRACK).
"""

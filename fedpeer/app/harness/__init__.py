"""A local federation of real daemon processes on loopback, for demos, tests and benchmarks
(`fedpeer harness`)."""

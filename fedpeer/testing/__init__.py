"""What tests, simulations and benchmarks build on (as trio ships trio.testing): the in-memory
network (memory.py), the seeded simulated network of membership nodes (simnet.py), running a
job's members in virtual time (members.py), frame builders for hostile-peer tests (frames.py) and
fast fake signatures for large simulations (fakesig.py). Nothing in the daemon imports it."""

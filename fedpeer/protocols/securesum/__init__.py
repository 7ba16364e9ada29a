"""The secure sum of uint64 vectors over a job's members: ring and pairwise masks, dropouts, blame
on evidence."""

"""The job kinds, one family a folder, each a JobKind on the contract in fedpeer/jobs/kind.py;
catalog.py lists them."""

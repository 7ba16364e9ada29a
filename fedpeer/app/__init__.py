"""What an operator types: the command line, its output, `fedpeer data check`, predict and export,
site files, the local harness."""

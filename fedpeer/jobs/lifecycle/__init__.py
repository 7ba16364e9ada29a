"""A job's life at this site: propose, admit, accept, start, run, abort, cancel, and the node's
channel for it."""

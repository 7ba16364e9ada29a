"""The Channel a job's protocol code talks through: send, recv, members, time, progress."""

"""Raft-style leader election (PreVote, CheckQuorum) as a pure state machine, with signed votes and
leader certificates."""

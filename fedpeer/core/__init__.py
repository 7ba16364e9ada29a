"""Pure state machines: time, randomness and messages in, messages out; nothing else of fedpeer."""

"""SWIM membership and failure detection (with Lifeguard's 'slow is not dead') as a pure state
machine."""

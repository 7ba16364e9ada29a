"""Multi-party protocols every kind uses over a Channel: fixed-point encodings, the secure sum, going
on over the survivors of lost members."""

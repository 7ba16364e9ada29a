"""What every job shares, whatever its kind: the kind contract, shared parameters, records, lifecycle
messages and the lifecycle itself."""

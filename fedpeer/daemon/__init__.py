"""The running node: it wires every layer together and owns every task; its metrics, reload and
admin API."""

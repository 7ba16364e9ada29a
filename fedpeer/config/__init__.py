"""peers.toml -> frozen dataclasses, every limit named with its unit (the job kinds' [policy.<kind>]
tables are judged by fedpeer/kinds/catalog.py)."""

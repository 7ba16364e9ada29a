"""A site's rows: [data]'s sources and their checks, the Dataset, the memory and Dask engines."""

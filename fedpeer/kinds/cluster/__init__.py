"""Clustering jobs: exact k-means / fuzzy c-means, exact Gaussian mixtures, DBSCAN from shared
cluster descriptions."""

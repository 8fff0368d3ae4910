"""CTR data: readers (Criteo, Avazu, MovieLens), feature->row mapping, synthetic data, batching."""

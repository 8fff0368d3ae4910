"""sfjax: huge-embedding CTR training (MixCache + VSI) and vmapped AutoML in JAX."""

__version__ = "0.1.0"

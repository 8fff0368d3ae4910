"""sfjax.parallel."""

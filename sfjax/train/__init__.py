"""sfjax.train."""

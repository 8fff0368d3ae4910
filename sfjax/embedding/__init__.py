"""sfjax.embedding."""

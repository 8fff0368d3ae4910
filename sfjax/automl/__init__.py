"""sfjax.automl."""

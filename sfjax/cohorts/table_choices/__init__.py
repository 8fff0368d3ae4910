"""Per-trial choices about a data set's features and tables, traced in trial programs.

`bag_pooling` (each bag's pooling as a dynamic hyperparameter), `table_dims` (each
table's embedding dim as a column mask and a row width), `table_overrides` (a layout's
per-table optimizers, learning rates, initializers and initial slots in trial programs).
"""

from sfjax.cohorts.table_choices.bag_pooling import pooled_feature, pooling_key
from sfjax.cohorts.table_choices.table_dims import dim_key, dimmed_table

__all__ = ["dim_key", "dimmed_table", "pooled_feature", "pooling_key"]

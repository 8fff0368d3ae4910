"""Shape buckets: trials of different architectures that share one padded, vmapped program.

`buckets` (a trial's bucket key, the superset architecture and per-trial masks),
`bucket_blocks` (composed models: the union of their block specs and per-trial gates),
`bucket_layout` (where a narrower trial's embedding columns and slots sit in the
superset's rows).
"""

from sfjax.cohorts.shape_buckets.buckets import bucket_key, fixed_config_keys

__all__ = ["bucket_key", "fixed_config_keys"]

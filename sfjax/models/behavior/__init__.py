"""Models of features with several ids: bag pooling and DIN's attention over a history.

  pool_features / PooledInput (`pooling`)   sum / mean / sqrtn bags, per-id weights, masks
  DIN (`din`)                               target attention over a behaviour sequence
"""

from sfjax.models.behavior.din import DIN
from sfjax.models.behavior.pooling import PooledInput, pool_features

__all__ = ["DIN", "PooledInput", "pool_features"]

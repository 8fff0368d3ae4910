"""sfjax.core: the small shared base every subpackage may import (and nothing else of sfjax).

Errors that name the bad place, the per-step device input type, SplitMix64 hashing,
background pipeline stages, exact metrics and atomic file writes.
"""

from sfjax.core.atomic import atomic_write, fsync_directory
from sfjax.core.background import BackgroundIterator, map_in_background
from sfjax.core.errors import ConfigError, DataFormatError
from sfjax.core.hashing import splitmix64
from sfjax.core.types import DeviceBatch

__all__ = [
  "BackgroundIterator",
  "ConfigError",
  "DataFormatError",
  "DeviceBatch",
  "atomic_write",
  "fsync_directory",
  "map_in_background",
  "splitmix64",
]

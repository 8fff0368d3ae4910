"""sfjax: huge-embedding CTR training (MixCache + VSI) and vmapped AutoML in JAX.

Each subpackage's root re-exports its public names (`from sfjax.train import
train_and_evaluate`); `sfjax.<subpackage>` is imported on first use, so `import sfjax`
itself loads no JAX.
"""

import importlib

__version__ = "0.1.0"

# The subpackages, in the order of their layers (DESIGN.md §5).
SUBPACKAGES = ("core", "data", "embedding", "models", "parallel", "checkpoint", "train",
               "serving", "automl", "cohorts", "structure", "compress", "ctr_search",
               "ctr_pipeline", "vision", "viz")

__all__ = ["SUBPACKAGES", "__version__", *SUBPACKAGES]


def __getattr__(name: str):
  """`sfjax.<subpackage>`, imported on first access (PEP 562)."""
  if name in SUBPACKAGES:
    return importlib.import_module(f"sfjax.{name}")
  raise AttributeError(f"module 'sfjax' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(SUBPACKAGES))

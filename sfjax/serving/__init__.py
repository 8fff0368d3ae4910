"""sfjax.serving: a trained model served (issue #23).

Dynamic batching of requests for one predictor call (`DynamicBatcher`), and the HTTP
endpoint over a predictor (`make_app`: a Starlette app; `python -m experiments.serve`).
The HTTP names load Starlette on first use, so importing this package stays light.

The bundle and its predictor: `write_bundle(workdir, out_dir)` (module `bundle`; imports
the model code, so it loads on first use) writes a run's serving bundle (`manifest`
describes the format); `Predictor.load(path)` scores it with jax and numpy only
(`predictor`), mapping raw records as training did (`features`: `Features`,
`RecordError`) and reading rows from RAM or mmap (`row_source`), or through a device
row cache over the mmap files for tables bigger than RAM (`row_cache`); its compiled
programs (the forward alone, or gather and forward in one, `forward_program`); a lazily
initialised table stores only the rows training wrote and computes the others from
the trainer's init rule (`lazy_table`).
`score_files(bundle, input_glob, out)` scores whole input files in order (`scoring`;
`python -m experiments.predict`). A run on a feature layout (bags, weighted bags,
sequences, shared tables; DIN) serves the same way: records give lists of ids for its
bags and sequences (`layout_records`), rows go through VSI with padding.
"""

import importlib

from sfjax.serving.batcher import (
  BatcherSettings,
  BatcherStats,
  DynamicBatcher,
  QueueFull,
)
from sfjax.serving.features import Features, RecordError
from sfjax.serving.manifest import BundleError
from sfjax.serving.predictor import Predictor

_LAZY = {"ServerSettings": "sfjax.serving.http_app", "make_app": "sfjax.serving.http_app",
         "write_bundle": "sfjax.serving.bundle", "score_files": "sfjax.serving.scoring",
         "SCORING_FORMATS": "sfjax.serving.scoring", "LOAD_CLIENTS": "sfjax.serving.load_client",
         "encode_request": "sfjax.serving.load_client",
         "measure_level": "sfjax.serving.load_client",
         "parse_compiler_options": "sfjax.serving.forward_program"}

__all__ = [
  "LOAD_CLIENTS",
  "SCORING_FORMATS",
  "BatcherSettings",
  "BatcherStats",
  "BundleError",
  "DynamicBatcher",
  "Features",
  "Predictor",
  "QueueFull",
  "RecordError",
  "ServerSettings",
  "encode_request",
  "make_app",
  "measure_level",
  "parse_compiler_options",
  "score_files",
  "write_bundle",
]


def __getattr__(name: str):
  """The HTTP names, the bundle writer and batch scoring, imported on first access (PEP 562)."""
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'sfjax.serving' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_LAZY))

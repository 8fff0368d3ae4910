"""Overriding the pooling of a data set's bags (`data.pooling`, issue #22).

A search may choose each multi_hot feature's pooling (`features.<name>.pooling` of a
trial config, `sfjax.cohorts.table_choices.bag_pooling`); the trainer reproduces the choice with
`data.pooling = "tags:mean,long0:sqrtn"`. `RepooledFeatures` wraps any data set and
replaces those features' poolings in its layout; ids, weights, labels, dense features
and the oracle are the wrapped data set's (pooling is the model's, `models.pooling`).
"""

from __future__ import annotations

import dataclasses

from sfjax.core import feature_layout as fl
from sfjax.core.entries import named_entries
from sfjax.core.errors import ConfigError
from sfjax.data import feature_select
from sfjax.data.types import DatasetSpec

_FIELD = "data.pooling"


def parse_poolings(text: str) -> dict[str, str]:
  """`'tags:mean, long0:sqrtn'` -> {'tags': 'mean', 'long0': 'sqrtn'}; '' -> {}.

  Raises:
    ConfigError: naming `data.pooling`, for an entry that is not `name:pooling`, an unknown
      pooling or a feature named twice.
  """
  out: dict[str, str] = {}
  for name, pooling in named_entries(text, _FIELD, form="feature:pooling", kind="feature"):
    if pooling not in fl.POOLINGS:
      raise ConfigError(f"config field {_FIELD}: {name}: pooling must be one of "
                        f"{', '.join(fl.POOLINGS)}, got {pooling!r}")
    out[name] = pooling
  return out


def with_poolings(spec: DatasetSpec, poolings: dict[str, str]) -> DatasetSpec:
  """`spec` whose named multi_hot features pool as `poolings` says.

  Raises:
    ConfigError: naming `data.pooling`, for a name that is not a multi_hot feature.
  """
  if not poolings:
    return spec
  bags = [] if spec.layout is None else [f.name for f in spec.layout.features
                                          if f.kind == "multi_hot"]
  for name in poolings:
    if name not in bags:
      raise ConfigError(f"config field {_FIELD}: {name!r} is not a multi_hot feature of the "
                        f"data set (its bags: {', '.join(bags) or 'none'})")
  layout = spec.layout
  assert layout is not None  # bags exist only in a layout (checked above)
  features = tuple(dataclasses.replace(f, pooling=poolings.get(f.name, f.pooling))
                   for f in layout.features)
  return dataclasses.replace(spec, layout=dataclasses.replace(layout, features=features))


class RepooledFeatures(feature_select.DatasetView):
  """A data set whose bags pool as `poolings` says (see the module docstring); its
  batches are the wrapped set's.

  Args:
    dataset: any `CTRDataset` with a feature layout.
    poolings: feature name -> 'sum' | 'mean' | 'sqrtn'.
  """

  def __init__(self, dataset, poolings: dict[str, str]):
    super().__init__(dataset)
    self.spec = with_poolings(dataset.spec, poolings)


def with_pooling(dataset, pooling: str):
  """`dataset` itself when `pooling` is '', else `RepooledFeatures` of its entries."""
  poolings = parse_poolings(pooling)
  return dataset if not poolings else RepooledFeatures(dataset, poolings)

"""Training on a subset of a data set's features (`data.use_features`, issue #22).

Ablations ask what a feature is worth: the planted multi-hot data with its one-hot
fields only, MovieLens without the history. `SelectedFeatures` wraps any data set and
keeps the named features: their id columns, weights and tables (a table no kept
feature reads is dropped, the rest keep their order); labels, dense features and
the oracle are the wrapped data set's. When every kept feature is one-hot and reads
its own table, the result has no layout at all (`weights=None`): exactly the one-hot
path of a data set that never had the others.
"""

from __future__ import annotations

import numpy as np

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data.types import Batch, DatasetSpec, FieldSpec


def parse_names(text: str) -> tuple[str, ...]:
  """`'a, b'` -> ('a', 'b'); '' -> ()."""
  return tuple(n.strip() for n in str(text).split(",") if n.strip())


def select_layout(spec: DatasetSpec, keep: tuple[str, ...]) -> tuple[DatasetSpec, np.ndarray]:
  """(the spec of the kept features, the [S'] id columns of `spec` they read).

  Raises:
    ConfigError: a name that is not a feature of `spec`, or a name given twice.
  """
  layout = spec.layout or fl.one_hot_layout([f.name for f in spec.fields], spec.field_rows)
  known = [f.name for f in layout.features]
  for name in keep:
    if name not in known:
      raise ConfigError(f"config field data.use_features: unknown feature {name!r} "
                        f"(known: {', '.join(known)})")
  if len(set(keep)) != len(keep):
    raise ConfigError(f"config field data.use_features: a feature is named twice in {keep}")
  kept = [i for i, f in enumerate(layout.features) if f.name in keep]  # data set order
  features = tuple(layout.features[i] for i in kept)
  tables = tuple(t for t in layout.tables if any(f.table == t.name for f in features))
  columns = np.concatenate([np.arange(layout.columns(i).start, layout.columns(i).stop)
                            for i in kept]).astype(np.int64)
  fields = tuple(FieldSpec(f.name, spec.fields[i].num_rows) for i, f in zip(kept, features,
                                                                              strict=True))
  one_hot = all(f.kind == "one_hot" for f in features) and len(tables) == len(features)
  new = fl.FeatureLayout(tables, features)
  return DatasetSpec(fields, spec.num_dense, None if one_hot else new), columns


class DatasetView:
  """A data set seen through a wrapper: its eval splits, oracle and stats are the wrapped
  set's (labels never change); subclasses set `spec` and may map the batches."""

  def __init__(self, dataset):
    self.dataset = dataset

  @property
  def eval_splits(self) -> tuple[str, ...]:
    """The wrapped data set's eval splits."""
    return self.dataset.eval_splits

  @property
  def oracle(self):
    """The wrapped data set's oracle (labels are unchanged)."""
    return self.dataset.oracle

  @property
  def stats(self) -> dict:
    """The wrapped data set's stats."""
    return self.dataset.stats

  def _map(self, batch: Batch) -> Batch:
    """A wrapped batch as this view yields it (unchanged by default)."""
    return batch

  def train_batches(self, batch_size: int, seed: int):
    """The wrapped training batches, through `_map`."""
    return map(self._map, self.dataset.train_batches(batch_size, seed))

  def eval_batches(self, split: str, batch_size: int):
    """The wrapped eval batches, through `_map`."""
    return map(self._map, self.dataset.eval_batches(split, batch_size))


class SelectedFeatures(DatasetView):
  """A data set reduced to some of its features (see the module docstring).

  Args:
    dataset: any `CTRDataset`.
    keep: feature names, at least one.
  """

  def __init__(self, dataset, keep: tuple[str, ...]):
    if not keep:
      raise ConfigError("config field data.use_features: names no feature")
    super().__init__(dataset)
    self.spec, self._columns = select_layout(dataset.spec, tuple(keep))

  @property
  def stats(self) -> dict:
    """The wrapped data set's stats plus the kept features."""
    return dict(self.dataset.stats, features=[f.name for f in self.spec.fields])

  def _map(self, batch: Batch) -> Batch:
    ids = np.ascontiguousarray(batch.ids[:, self._columns])
    weights = None
    if self.spec.layout is not None:
      weights = (np.ones(ids.shape, np.float32) if batch.weights is None
                 else np.ascontiguousarray(batch.weights[:, self._columns]))
    return batch._replace(ids=ids, weights=weights)


def with_features(dataset, use_features: str):
  """`dataset` itself when `use_features` is '', else `SelectedFeatures` of the names."""
  keep = parse_names(use_features)
  return dataset if not keep else SelectedFeatures(dataset, keep)


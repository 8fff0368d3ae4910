"""A small in-memory data set with bags, weighted bags, a sequence and a shared table.

Used by the multi-hot step, backend and checkpoint tests (issue #22): every example
draws random bag lengths (0 .. capacity, so empty bags and full bags both occur) and
ids from small tables, so a bag often holds the same id twice and the sequence shares
rows with the target item.
"""

from __future__ import annotations

import numpy as np

from sfjax.core import feature_layout as fl
from sfjax.data import batching, types

LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 300), fl.TableSpec("item", 500), fl.TableSpec("tag", 40)),
    (fl.FeatureSpec("user", "user"),
     fl.FeatureSpec("item", "item"),
     fl.FeatureSpec("tags", "tag", "multi_hot", 5, "mean", weighted=True),
     fl.FeatureSpec("tags_sum", "tag", "multi_hot", 4, "sum"),
     fl.FeatureSpec("tags_sqrtn", "tag", "multi_hot", 3, "sqrtn"),
     fl.FeatureSpec("history", "item", "sequence", 6)))
# LAYOUT's features over tables that set their own row optimizer, rate and initializer
# (issue #22 Deliver 1); "" / 0 would mean the `embedding` block's settings.
TABLES_LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 300, "sgd", 0.5),
     fl.TableSpec("item", 500, "adagrad", 0.1, init_stddev=0.02),
     fl.TableSpec("tag", 40, "rowwise_adagrad", 0.05, init_stddev=0.1)),
    LAYOUT.features)
# TABLES_LAYOUT's tables with their own embedding dims too (user: the model's).
DIMS_LAYOUT = fl.FeatureLayout(
    (TABLES_LAYOUT.tables[0],
     fl.TableSpec("item", 500, "adagrad", 0.1, init_stddev=0.02, dim=2),
     fl.TableSpec("tag", 40, "rowwise_adagrad", 0.05, init_stddev=0.1, dim=3)),
    LAYOUT.features)
NUM_DENSE = 2


def spec(layout: fl.FeatureLayout = LAYOUT) -> types.DatasetSpec:
  """The DatasetSpec of `layout`: one field per feature, its table's rows."""
  fields = tuple(types.FieldSpec(f.name, layout.tables[layout.table_index(f.table)].num_rows)
                 for f in layout.features)
  return types.DatasetSpec(fields, NUM_DENSE, layout)


def make_rows(n: int, seed: int, layout: fl.FeatureLayout = LAYOUT) -> types.Batch:
  """`n` examples: one-hot ids, bags of random length (duplicates allowed), labels."""
  rng = np.random.default_rng(seed)
  ids = np.full((n, layout.num_columns), -1, np.int64)
  weights = np.zeros((n, layout.num_columns), np.float32)
  for f, feature in enumerate(layout.features):
    cols = layout.columns(f)
    rows = layout.tables[layout.table_index(feature.table)].num_rows
    length = (np.ones(n, np.int64) if feature.kind == "one_hot"
              else rng.integers(0, feature.capacity + 1, n))
    for j in range(feature.capacity):
      real = length > j
      ids[real, cols.start + j] = rng.integers(0, rows, int(real.sum()))
      w = rng.uniform(0.25, 2.0, int(real.sum())) if feature.weighted else 1.0
      weights[real, cols.start + j] = w
  dense = rng.normal(size=(n, NUM_DENSE))
  # Labels depend on the bags, so the bags' rows get real gradients.
  logit = 0.3 * np.sin(ids[:, 0]) + 0.05 * np.where(ids >= 0, ids % 3, 0).sum(1) - 0.8
  labels = rng.random(n) < 1 / (1 + np.exp(-logit))
  return types.make_batch(ids, dense, labels, weights=weights)


class BagDataset:
  """`CTRDataset` over `make_rows`: a train split and an 'eval' split, in memory."""

  def __init__(self, num_train: int = 2048, num_eval: int = 512, seed: int = 0,
               layout: fl.FeatureLayout = LAYOUT):
    self.spec = spec(layout)
    self.eval_splits = ("eval",)
    self.oracle = None
    self.stats = {"bad_lines": 0}
    self._train = make_rows(num_train, seed, layout)
    self._eval = make_rows(num_eval, seed + 1, layout)

  def train_batches(self, batch_size: int, seed: int):
    """Infinite shuffled full batches."""
    rng = np.random.default_rng(seed)

    def epoch():
      return [batching.take(self._train, rng.permutation(self._train.size))]

    return batching.train_batches(epoch, batch_size, shuffle_buffer=0, seed=seed)

  def eval_batches(self, split: str, batch_size: int):
    """The eval split, the last batch padded with mask 0."""
    del split
    return batching.eval_batches([self._eval], batch_size)

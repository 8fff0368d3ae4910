"""What every CTR trial trains on: the task description and its precomputed device data.

`CTRTask` is static (frozen, hashable). `TrialData` is built once per study from
it: the host work of every train step (batching + VSI, DESIGN.md §2) is done
once and stacked on device along a leading `[T]` step axis, and the evaluation
set is stacked along `[Te]` (the last batch padded with mask 0). A trial's run
over steps `[t0, t1)` is then `lax.scan(step, state, batches[t0:t1])` with no
host work inside, and every trial of a study sees the same batches in the same
order, so trials differ only by their config and seed.

Touched rows (`CTRTask.compact_rows`): since every trial of a task reads the same
precomputed batches, the rows any trial can ever read or write are known before
the first trial runs: the union U of the unique ids of every train step up to
`max_steps` and of the eval set. With `compact_rows` the batches' row ids are
renumbered into that union (`TrialData.row_ids`: compact row -> global id), and a
trial's table holds `U` rows instead of the full `V`: memory per trial is bounded
by what the search's data touches, not by the table's cardinality (a 1e8-row
table searched over 10^5 touched rows costs 10^5 rows per trial). The trials are
the same as with a full table up to the random draw of their initial rows (the
rows no batch touches never change and are never read).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax import lax

from sfjax.cohorts.table_choices import table_overrides
from sfjax.core import xla_cpu_dots
from sfjax.data import dataset as dataset_lib
from sfjax.data.types import Batch
from sfjax.embedding import vsi
from sfjax.train import state as state_lib

# CTRTask.embedding_backend values: a table per trial on device, or one shared host table.
EMBEDDING_BACKENDS = ("device", "cache")


def _positive(name: str, value: Any, low: int = 1) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f"CTRTask.{name} must be an integer >= {low}, got {value!r}")
  return int(value)


@dataclasses.dataclass(frozen=True)
class CTRTask:
  """The training problem shared by every trial of a study.

  Attributes:
    data: the `data` block of `experiments/configs/ctr.py` (a ConfigDict or a
      nested mapping; stored frozen). `data.format` 'synthetic' is the tested one.
    seed: data seed (synthetic generator and train-batch shuffling).
    batch_size: B, examples per train step.
    eval_rows: examples of the first eval split every trial is scored on.
    steps_per_budget_unit: a budget `b` means `round(b * steps_per_budget_unit)` steps.
    eval_batch_size: examples per stacked eval batch (memory of one eval step).
    max_steps: train steps precomputed up front (0: grown on demand).
    unique_capacity: padded unique rows per step (0: batch_size * S id columns, + 1
      padding entry for a layout with bags or sequences; `vsi.unique_capacity`).
    compact_rows: trial tables hold only the rows the task's batches touch (see the
      module docstring); needs `max_steps` > 0 (the steps are fixed up front).
    embedding_backend: where trial tables live: 'device' (each trial its own table in the
      program) or 'cache' (a cohort's W trials share one host table of W*E-wide rows behind
      one device cache: `sfjax.cohorts.host_cohort`; not with `compact_rows`).
    cache_rows: rows of the 'cache' backend's device cache (0: auto, as the trainer's
      `embedding.cache_rows`).
    cache_lookahead: steps the 'cache' backend plans ahead (the trainer's `embedding.lookahead`).
    xla_cpu_dots: the library XLA:CPU computes the cohort programs' dots with, as the
      trainer's `train.xla_cpu_dots` ('auto', 'eigen' or 'xla'; `sfjax.core.xla_cpu_dots`):
      float rounding only, so not part of what a study's trials depend on.
  """

  data: Any
  seed: int = 0
  batch_size: int = 128
  eval_rows: int = 8192
  steps_per_budget_unit: int = 10
  eval_batch_size: int = 1024
  max_steps: int = 0
  unique_capacity: int = 0
  compact_rows: bool = False
  embedding_backend: str = "device"
  cache_rows: int = 0
  cache_lookahead: int = 2
  xla_cpu_dots: str = "auto"

  def __post_init__(self):
    data = self.data
    if isinstance(data, Mapping) and not isinstance(data, ml_collections.ConfigDict):
      data = ml_collections.ConfigDict(dict(data))
    if not isinstance(data, ml_collections.ConfigDict) or "format" not in data:
      raise ValueError("CTRTask.data must be the `data` block of experiments/configs/ctr.py "
                       f"(it has no `format` field): {data!r}")
    object.__setattr__(self, "data", ml_collections.FrozenConfigDict(data))
    for name in ("seed", "max_steps", "unique_capacity", "cache_rows"):
      object.__setattr__(self, name, _positive(name, getattr(self, name), low=0))
    for name in ("batch_size", "eval_rows", "steps_per_budget_unit", "eval_batch_size",
                 "cache_lookahead"):
      object.__setattr__(self, name, _positive(name, getattr(self, name)))
    if not isinstance(self.compact_rows, (bool, np.bool_)):
      raise ValueError(f"CTRTask.compact_rows must be True or False, got {self.compact_rows!r}")
    if self.embedding_backend not in EMBEDDING_BACKENDS:
      raise ValueError(f"CTRTask.embedding_backend must be one of {list(EMBEDDING_BACKENDS)}, "
                       f"got {self.embedding_backend!r}")
    if self.embedding_backend == "cache" and self.compact_rows:
      raise ValueError("CTRTask.embedding_backend='cache' keeps the whole table on the host: "
                       "set compact_rows=False")
    if self.xla_cpu_dots not in xla_cpu_dots.CHOICES:
      raise ValueError(f"CTRTask.xla_cpu_dots must be one of {list(xla_cpu_dots.CHOICES)}, "
                       f"got {self.xla_cpu_dots!r}")
    if self.compact_rows and not self.max_steps:
      raise ValueError("CTRTask.compact_rows needs max_steps > 0: the touched rows are "
                       "those of the train steps fixed up front")

  @property
  def compiler_options(self) -> tuple[tuple[str, str], ...]:
    """The `jax.jit` compiler options of the task's cohort programs on this process's default
    platform (`xla_cpu_dots`), as sorted pairs (hashable: a key of the cached programs)."""
    return tuple(sorted(xla_cpu_dots.compiler_options(self.xla_cpu_dots,
                                                      jax.default_backend()).items()))

  def steps_for_budget(self, budget: float) -> int:
    """Train steps of budget `budget` (>= 0): `round(budget * steps_per_budget_unit)`."""
    if not 0 <= budget < math.inf:
      raise ValueError(f"budget must be a finite number >= 0, got {budget!r}")
    return int(round(budget * self.steps_per_budget_unit))


def _stack_batches(batches: list[state_lib.DeviceBatch]) -> state_lib.DeviceBatch:
  """[N] host DeviceBatches -> one DeviceBatch of numpy arrays with a leading [N] axis."""
  return state_lib.DeviceBatch(*(None if parts[0] is None else np.stack(parts)
                                 for parts in zip(*batches, strict=True)))


@functools.partial(jax.jit, static_argnums=2)
def _slice_steps(batches: state_lib.DeviceBatch, start: jax.Array, length: int):
  # `start` is traced: one compiled slice per (T, length), whatever the start.
  return jax.tree.map(lambda x: lax.dynamic_slice_in_dim(x, start, length), batches)


class TrialData:
  """Precomputed device inputs of every trial of a task.

  Attributes:
    task: the CTRTask.
    dataset: the data set (`sfjax.data.dataset.CTRDataset`).
    spec: its DatasetSpec.
    num_rows: rows of a trial's table (also the padding row): V, the concatenated
      embedding table's rows, or with `task.compact_rows` U, the rows the task touches.
    full_rows: V.
    row_ids: [U] int64 global id of each compact row (None without compact_rows).
    table_starts: with compact_rows and a feature layout, the first compact row of each
      table (`table_overrides.compact_table_starts`); None otherwise (rows are global ids).
    capacity: padded unique rows per train step.
    eval_batches: DeviceBatch with leading [Te] axis, rows [Te, Be*S (+1)], vids [Te, Be, S],
      weights [Te, Be, S] with a feature layout (else None), ...
    eval_labels: [Te*Be] float32 host labels; eval_mask: [Te*Be] float32 (0 = padding).
    max_unique: the largest unique-id count of any precomputed train step.
  """

  def __init__(self, task: CTRTask, dataset=None):
    """Builds the data set (unless given), the eval stack and `task.max_steps` train steps."""
    self.task = task
    self.dataset = dataset if dataset is not None else dataset_lib.make_dataset(task.data, task.seed)
    self.spec = self.dataset.spec
    self.num_rows = self.full_rows = self.spec.total_rows
    self.row_ids: np.ndarray | None = None
    self.table_starts: tuple[int, ...] | None = None
    self.capacity = task.unique_capacity or vsi.unique_capacity(
        task.batch_size, self.spec.num_columns, self.spec.has_padding)
    self.max_unique = 0
    self._source = self.dataset.train_batches(task.batch_size, task.seed)
    self._train: state_lib.DeviceBatch | None = None
    self._num_steps = 0
    self.eval_batches, self.eval_labels, self.eval_mask = self._build_eval()
    if task.max_steps:
      self.ensure_steps(task.max_steps)
    if task.compact_rows:
      self._compact()

  def _compact(self) -> None:
    """Renumbers the rows of every batch into the union of the rows they touch."""
    train = self._train
    if train is None:  # CTRTask already checks this
      raise ValueError("CTRTask.compact_rows needs max_steps > 0: no train steps to compact")
    eval_rows, train_rows = np.asarray(self.eval_batches.rows), np.asarray(train.rows)
    ids = np.unique(np.concatenate([eval_rows.reshape(-1), train_rows.reshape(-1)]))
    row_ids = self.row_ids = ids[ids < self.full_rows].astype(np.int64)
    self.num_rows = int(row_ids.shape[0])  # U: also the new padding row
    self.table_starts = table_overrides.compact_table_starts(self.spec, row_ids)

    def renumber(rows: np.ndarray) -> jax.Array:
      compact = np.searchsorted(row_ids, rows)
      return jnp.asarray(np.where(rows < self.full_rows, compact, self.num_rows).astype(np.int32))

    self.eval_batches = self.eval_batches._replace(rows=renumber(eval_rows))
    self._train = train._replace(rows=renumber(train_rows))

  def _prepare(self, batch: Batch, capacity: int) -> state_lib.DeviceBatch:
    device_batch, num_unique = vsi.prepare_batch(batch, self.spec.column_offsets, capacity,
                                                 self.num_rows, self.spec.column_rows)
    self.max_unique = max(self.max_unique, num_unique)
    return device_batch

  def _build_eval(self):
    split = self.dataset.eval_splits[0]
    size, wanted = self.task.eval_batch_size, self.task.eval_rows
    prepared, labels, masks, seen = [], [], [], 0
    for batch in self.dataset.eval_batches(split, size):
      keep = np.clip(wanted - seen - np.arange(size), 0, 1).astype(np.float32)  # rows past eval_rows
      batch = batch._replace(mask=batch.mask * keep)
      seen += int(batch.mask.sum())
      prepared.append(self._prepare(batch, vsi.unique_capacity(
          size, self.spec.num_columns, self.spec.has_padding)))
      labels.append(batch.labels)
      masks.append(batch.mask)
      if seen >= wanted:
        break
    if not prepared:
      raise ValueError(f"eval split {split!r} of data.format={self.task.data.format!r} is empty")
    stacked = jax.tree.map(jnp.array, _stack_batches(prepared))  # jnp.array copies (DESIGN §7)
    return stacked, np.concatenate(labels), np.concatenate(masks)

  @property
  def num_eval_examples(self) -> int:
    """Real (mask = 1) eval examples: `task.eval_rows`, or fewer if the split is smaller."""
    return int(self.eval_mask.sum())

  @property
  def num_steps(self) -> int:
    """T, train steps precomputed so far."""
    return self._num_steps

  def ensure_steps(self, num_steps: int) -> None:
    """Precomputes train steps up to `num_steps` (host VSI, then one transfer)."""
    if num_steps <= self._num_steps:
      return
    if self.row_ids is not None:
      raise ValueError(f"train steps up to {num_steps} were asked for, but the task has "
                       f"CTRTask.compact_rows with max_steps={self.task.max_steps}: raise "
                       "max_steps to the largest budget's steps")
    new = [self._prepare(next(self._source), self.capacity)
           for _ in range(num_steps - self._num_steps)]
    stacked = jax.tree.map(jnp.array, _stack_batches(new))
    if self._train is not None:
      stacked = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), self._train, stacked)
    self._train, self._num_steps = stacked, num_steps

  def train_steps(self, start: int, end: int) -> state_lib.DeviceBatch:
    """Device batches of steps `[start, end)` with a leading [end - start] axis."""
    if not 0 <= start <= end:
      raise ValueError(f"step range [{start}, {end}) is not a valid range of train steps")
    self.ensure_steps(max(end, 1))
    return _slice_steps(self._train, jnp.int32(start), end - start)

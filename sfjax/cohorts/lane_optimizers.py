"""Per-lane row optimizers: trials with different `embedding.optimizer` in one program.

Issue #26, Deliver 0(a): a cohort formed from the algorithm's own proposals holds
trials of several row optimizers; one vmapped program serves them all when each
lane picks its optimizer by an index (`LANE_KEY`, a per-trial program input):

  * the program's ArchSpec names the set, `lanes_name(("adagrad", "adam"))` ->
    `"lanes:adagrad|adam"` (`buckets.superset` writes it for a mixed chunk);
  * a lane's slots are the union of what its set needs, `max_k S_k(E)` columns:
    optimizer k reads and writes its first `S_k`, the others stay as they are (as
    `row_optimizers.per_table` does for tables);
  * every optimizer of the set updates the batch's rows and `jnp.where` keeps the
    lane's own: its rows and slots are exactly what its own optimizer computes on
    its own inputs, so a trial of a mixed program equals its solo run (to float
    tolerance; `tests/cohorts/lane_optimizers_test.py`).

The cost is the other optimizers' element-wise work on the touched rows, `[U, E]`
per optimizer per step: small beside the model's forward and backward.

Row widths: a composed trial's rows may be narrower than its program's (its columns past
its own dims are padding of gradient exactly 0, `bucket_blocks`). Element-wise row
optimizers leave such columns still; rowwise_adagrad averages over the row, so a program
whose trials' widths differ takes each lane's own width e as `ROW_WIDTH_KEY` (a per-trial
program input, float32) and divides the row's squared-gradient sum by it
(`row_optimizers.rowwise_adagrad(..., row_width=e)`): the mean over the trial's own columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from sfjax.embedding import row_optimizers
from sfjax.embedding.row_optimizers import RowOptimizer

LANE_KEY = "embedding.optimizer_lane"  # per-trial program input: index into the lane set
ROW_WIDTH_KEY = "embedding.row_width"  # per-trial program input: the trial's own row width e
_PREFIX = "lanes:"
_SEP = "|"


def lanes_name(names: Sequence[str]) -> str:
  """The ArchSpec `embedding_optimizer` of a program serving row optimizers `names`
  (distinct, in `row_optimizers.ROW_OPTIMIZER_NAMES` order); a single name stays itself.

  Raises:
    ValueError: an empty set, or a name that is not a row optimizer.
  """
  distinct = set(names)
  unknown = sorted(distinct - set(row_optimizers.ROW_OPTIMIZER_NAMES))
  if not distinct or unknown:
    raise ValueError(f"lanes_name: need row optimizer names of "
                     f"{row_optimizers.ROW_OPTIMIZER_NAMES}, got {sorted(distinct)}")
  ordered = [n for n in row_optimizers.ROW_OPTIMIZER_NAMES if n in distinct]
  return ordered[0] if len(ordered) == 1 else _PREFIX + _SEP.join(ordered)


def lane_names(name: str) -> tuple[str, ...]:
  """The row optimizers a program's `embedding_optimizer` serves: `(name,)` for a plain one."""
  if name.startswith(_PREFIX):
    return tuple(name[len(_PREFIX):].split(_SEP))
  return (name,)


def lane_index(name: str, own: str) -> int:
  """The `LANE_KEY` value of a trial whose row optimizer is `own` in program `name`.

  Raises:
    ValueError: `own` is not served by `name`.
  """
  names = lane_names(name)
  if own not in names:
    raise ValueError(f"lane_index: row optimizer {own!r} is not one of the program's {names}")
  return names.index(own)


def choose_lane_optimizer(optimizers: Sequence[RowOptimizer], choice) -> RowOptimizer:
  """One RowOptimizer that applies `optimizers[choice]` (`choice` an int or traced int32
  scalar: a lane's index) to every row, over slots of `max_k S_k` columns.

  `initial_slot_row` is zeros of the union width: a program with several optimizers
  starts only from padded host states, each lane's own slots set by `buckets.pad_state`.
  """
  optimizers = tuple(optimizers)
  if not optimizers:
    raise ValueError("choose_lane_optimizer: no optimizers")

  def slot_width(e):
    return max(opt.slot_width(e) for opt in optimizers)

  def update(rows, slots, grads, count):
    new_rows, new_slots = rows, slots
    for k, opt in enumerate(optimizers):
      width = opt.slot_width(rows.shape[-1])
      moved, moved_slots = opt.update(rows, slots[:, :width], grads, count)
      mine = jnp.asarray(choice) == k
      new_rows = jnp.where(mine, moved, new_rows)
      if width:
        kept = jnp.where(mine, moved_slots, new_slots[:, :width])
        new_slots = jnp.concatenate([kept, new_slots[:, width:]], axis=1)
    return new_rows, new_slots

  name = lanes_name([opt.name for opt in optimizers])
  return RowOptimizer(name, slot_width, lambda e: np.zeros((slot_width(e),), np.float32), update)


def make_lane_optimizer(name: str, learning_rate, settings, choice=0,
                        field: str = "embedding.optimizer", row_width=None) -> RowOptimizer:
  """The row optimizer of a program's `embedding_optimizer` `name`: `row_optimizers.make`
  for a plain name, `choose_lane_optimizer` over its set (at lane index `choice`) for a lanes
  name. `row_width`: None, or the lane's own row width e (`ROW_WIDTH_KEY`), which
  rowwise_adagrad averages over (the element-wise optimizers do not read it)."""

  def make(n):
    return row_optimizers.make(n, learning_rate, settings, field=field, row_width=row_width)

  names = lane_names(name)
  if len(names) == 1:
    return make(name)
  return choose_lane_optimizer([make(n) for n in names], choice)

"""Train state and per-step device inputs of the CTR trainer.

`TrainState` is the single pytree threaded through the jitted, donated step.
`DeviceBatch` is the fixed-shape per-step input: after VSI the device sees only
int32 rows/slots and virtual ids, never raw (possibly 64-bit) feature ids.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from sfjax.data import types
from sfjax.embedding import device_table
from sfjax.embedding import vsi


class TrainState(NamedTuple):
  """Everything a step reads and writes.

  Attributes:
    step: int32 scalar, number of steps taken.
    params: dense model parameters (an `nnx.State`).
    opt_state: optax state of the dense parameters.
    table: embedding rows + row-optimizer slots (`TableState`).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  table: device_table.TableState


class DeviceBatch(NamedTuple):
  """One step's inputs, fixed shapes.

  Attributes:
    rows: [U] int32 table rows (or cache slots) of the batch's unique ids; padding = V.
    vids: [B, F] int32 virtual ids into `rows`.
    dense: [B, Nd] float32.
    labels: [B] float32.
    mask: [B] float32, 0 for padding examples.
  """

  rows: Any
  vids: Any
  dense: Any
  labels: Any
  mask: Any


def prepare_batch(batch: types.Batch, field_offsets: np.ndarray, capacity: int,
                  num_rows: int) -> tuple[DeviceBatch, int]:
  """Host side of a step: VSI over the batch, ids -> int32 rows (numpy).

  Args:
    batch: host batch with per-field local ids.
    field_offsets: [F] start of each field in the concatenated table.
    capacity: padded size of the unique set.
    num_rows: V, the table size; also the padding row.

  Returns:
    (DeviceBatch of numpy arrays, number of unique ids).
  """
  if num_rows >= 2**31:
    raise ValueError(f"table of {num_rows} rows does not fit int32 device indices; "
                     "use the cache backend, whose slots are int32")
  ids = vsi.global_row_ids(batch.ids, field_offsets)
  virt = vsi.dedup_ids(ids, capacity, pad_id=num_rows)
  return DeviceBatch(virt.uniq.astype(np.int32), virt.vids, batch.dense, batch.labels,
                     batch.mask), virt.num_unique

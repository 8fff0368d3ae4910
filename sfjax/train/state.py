"""The train state threaded through the jitted, donated step.

The per-step device input is `sfjax.core.types.DeviceBatch` (re-exported here);
its host side (VSI) is `sfjax.embedding.vsi.prepare_batch`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from sfjax.core.types import DeviceBatch  # re-exported: the step's input
from sfjax.embedding import device_table


class TrainState(NamedTuple):
  """Everything a step reads and writes.

  Attributes:
    step: int32 scalar, number of steps taken.
    params: dense model parameters (an `nnx.State`).
    opt_state: optax state of the dense parameters.
    table: embedding rows + row-optimizer slots (`TableState`): the whole table
      (device backend) or the cache (cache backend).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  table: device_table.TableState


class DenseState(NamedTuple):
  """The state of a model without an embedding table (`step.make_dense_train_step`).

  Attributes:
    step: int32 scalar, number of steps taken.
    params: the trained parameters (any pytree).
    opt_state: optax state of `params`.
    model_state: non-parameter state the forward pass updates and no gradient
      reaches (batch-norm statistics); `()` for a model without any.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any


__all__ = ["DenseState", "DeviceBatch", "TrainState"]

"""Host parameter server: the row update done on the host, in numpy (SFCTR's baseline).

The step of a cache-less parameter server (ScaleFreeCTR's ablation row "host PS"):
every step pulls the batch's rows from the host table, the device computes their
gradients, and the host pushes the gradients back and updates the rows itself:

  values, slots = table.gather(ids)                 pull  [N, E], [N, S]
  (device step: loss, row grads [N, E])
  apply_row_grads(table, opt, ids, grads, count)    push: sum per id, update, scatter

The update rules are `sfjax.embedding.row_optimizers`' (same formulas, numpy instead
of jnp), so a host PS and a device table train the same model: a row touched twice in
a step gets one update with the summed gradient, exactly as the device step's
autodiff sums the gradients of one unique row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from sfjax.core import names
from sfjax.embedding import host_table as host_table_lib


class HostRowOptimizer(NamedTuple):
  """A numpy row optimizer (the host twin of `row_optimizers.RowOptimizer`).

  Attributes:
    name: the row optimizer's name (a `row_optimizers.ROW_OPTIMIZERS` key).
    update: (rows [U, E], slots [U, S], grads [U, E], count int) -> (rows, slots), float32.
  """

  name: str
  update: Callable[[np.ndarray, np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def host_sgd(learning_rate: float) -> HostRowOptimizer:
  """w -= lr * g."""

  def update(rows, slots, grads, count):
    del count
    return (rows - np.float32(learning_rate) * grads).astype(np.float32), slots

  return HostRowOptimizer("sgd", update)


def host_adagrad(learning_rate: float) -> HostRowOptimizer:
  """a += g^2; w -= lr * g / sqrt(a) (element-wise)."""

  def update(rows, slots, grads, count):
    del count
    acc = (slots + grads * grads).astype(np.float32)
    return (rows - np.float32(learning_rate) * grads / np.sqrt(acc)).astype(np.float32), acc

  return HostRowOptimizer("adagrad", update)


def host_rowwise_adagrad(learning_rate: float) -> HostRowOptimizer:
  """a_row += mean_j(g_j^2); w -= lr * g / sqrt(a_row) (one accumulator per row)."""

  def update(rows, slots, grads, count):
    del count
    acc = (slots + np.mean(grads * grads, axis=-1, keepdims=True)).astype(np.float32)  # [U, 1]
    return (rows - np.float32(learning_rate) * grads / np.sqrt(acc)).astype(np.float32), acc

  return HostRowOptimizer("rowwise_adagrad", update)


HOST_ROW_OPTIMIZERS: dict[str, Callable[[float], HostRowOptimizer]] = {
    "sgd": host_sgd, "adagrad": host_adagrad, "rowwise_adagrad": host_rowwise_adagrad}


def make_host_row_optimizer(name: str, learning_rate: float, field: str = "embedding.optimizer") -> HostRowOptimizer:
  """The host row optimizer `name` (sgd, adagrad, rowwise_adagrad).

  Raises:
    ConfigError: an unknown name (the message names `field`).
  """
  return names.lookup(HOST_ROW_OPTIMIZERS, name, field, "host row optimizer")(learning_rate)


def aggregate_row_grads(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Sums the gradients of equal ids (host aggregation).

  Args:
    ids: [N] int row ids, one per id occurrence.
    grads: [N, E] float32 gradient of each occurrence.

  Returns:
    (unique ids [U] int64 sorted, summed gradients [U, E] float32).
  """
  ids = np.asarray(ids).reshape(-1)
  grads = np.asarray(grads, np.float32).reshape(ids.shape[0], -1)
  uniq, inverse = np.unique(ids, return_inverse=True)
  summed = np.zeros((uniq.shape[0], grads.shape[1]), np.float32)
  np.add.at(summed, inverse.reshape(-1), grads)
  return uniq.astype(np.int64), summed


def apply_row_grads(table: host_table_lib.HostTable, opt: HostRowOptimizer, ids: np.ndarray,
                    grads: np.ndarray, count: int) -> int:
  """Pushes one step's row gradients: sums them per id, updates the rows, scatters them.

  Args:
    table: the host table (RAM or mmap).
    opt: the host row optimizer.
    ids: [N] row ids of the occurrences (the ids pulled this step).
    grads: [N, E] their gradients.
    count: the 1-based global step (the row optimizer's `count`).

  Returns:
    U, the number of distinct rows updated.
  """
  uniq, summed = aggregate_row_grads(ids, grads)
  values, slots = table.gather(uniq)
  new_values, new_slots = opt.update(values, slots, summed, count)
  table.scatter(uniq, new_values, new_slots)
  return int(uniq.shape[0])


def pull_rows(table: host_table_lib.HostTable, ids: np.ndarray) -> np.ndarray:
  """[N, E] float32 values of `ids` [N] (one row per occurrence: no dedup)."""
  values, _ = table.gather(np.asarray(ids).reshape(-1))
  return np.asarray(values, np.float32)


def host_row_optimizer_from_config(embedding_config: Any) -> HostRowOptimizer:
  """The host row optimizer of an `embedding` config block (`optimizer`, `learning_rate`)."""
  return make_host_row_optimizer(embedding_config.optimizer, float(embedding_config.learning_rate))

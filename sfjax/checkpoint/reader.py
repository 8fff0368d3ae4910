"""Read a committed checkpoint without the run that wrote it: `open_checkpoint(path)`.

  ckpt = open_checkpoint(workdir)        # its newest checkpoint that verifies (nothing renamed)
  ckpt = open_checkpoint(f"{workdir}/checkpoints/step_00000040")
  ckpt.step, ckpt.meta                   # meta.json; every file's size and CRC-32 checked
  ckpt.params, ckpt.opt_state            # numpy trees, restored by orbax without a target
  values, slots = ckpt.table.rows(ids)   # [N, E] rows and [N, S] row-optimizer slots
  for lo, values, slots in ckpt.table.chunks(): ...  # every row, CHUNK_ROWS at a time

Both embedding backends read alike. The device backend's table is part of the dense
state (orbax: `{"values", "opt_slots"}`; a row-sharded table's round-robin layout is in
meta.json's `table_layout`, and is read back in row order); the cache backend's is the host table's chunks
and row deltas, in one directory or per-process shards (`table_shards`), where a row
never written reads as its deterministic initial value (`init_rows`, and the row
optimizer's initial slots), as the `HostTable` returned it. Rows come back in the dtype
they were trained in (`CheckpointTable.dtype`: float32, or half-width `embedding.dtype`).

The trainer restores through here too (`checkpointer.Checkpointer.restore`): the same
meta.json check and dense-state layout, restored into its own shapes and shardings
(`Checkpoint.restore_dense`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from sfjax.checkpoint import layout, table_shards
from sfjax.embedding import (
  host_table_files,
  row_dtype,
  row_optimizers,
  row_sharded_table,
  sharded_cache,
)
from sfjax.embedding.host_table import CHUNK_ROWS
from sfjax.embedding.initializers import init_rows, init_table_rows

DENSE_DIR = "dense"  # orbax: {step, params, opt_state} (+ table: the device backend's)
TABLE_DIR = "table"  # the cache backend's host table (`table_format`, `table_shards`)
HOST_TABLE_KINDS = ("host_chunks", "host_shards")  # meta["table"] of a cache-backend checkpoint
# meta.json of a device-backend checkpoint: {"row_shards": D, "rows_per_shard": C}, the
# round-robin layout of a row-sharded table's saved `[D*C, E]` arrays (D = 1: row order).
TABLE_LAYOUT_KEY = "table_layout"

Rows = tuple[np.ndarray, np.ndarray]  # values [n, E], slots [n, S]


def without_empty(tree):
  """`tree` with zero-size arrays (SGD's [V, 0] slots) as None: orbax refuses to save them."""
  return jax.tree.map(lambda x: x if x.size else None, tree)


def _with_empty(restored, target):
  """`restored` (from a tree `without_empty` made) with `target`'s zero-size arrays put back."""
  leaves, _ = jax.tree_util.tree_flatten(restored, is_leaf=lambda x: x is None)
  target_leaves, treedef = jax.tree_util.tree_flatten(target)
  return jax.tree_util.tree_unflatten(
      treedef, [t if r is None else r for r, t in zip(leaves, target_leaves, strict=True)])


def _abstract(tree):
  """Shapes, dtypes and shardings of `tree` (a restore target; no data); numpy leaves stay
  (restored as numpy on the host)."""
  return jax.tree.map(lambda x: x if isinstance(x, np.ndarray) else jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=x.sharding), tree)


def table_layout_of(values) -> sharded_cache.SlotLayout:
  """The layout of a device table `values [D*C, E]`: D = the shards its rows are split in
  (a row-sharded table, `row_sharded_table`), 1 when whole on every device."""
  rows = int(values.shape[0])
  per = int(values.sharding.shard_shape(values.shape)[0]) if hasattr(values, "sharding") else rows
  return sharded_cache.SlotLayout(rows // max(per, 1), per)


def _values(table):
  """A device table's `values` (a TableState, or orbax's `{"values", "opt_slots"}`)."""
  return table["values"] if isinstance(table, dict) else table.values


def table_layout_entry(table) -> dict[str, int]:
  """meta.json's `TABLE_LAYOUT_KEY` entry for a device table (`table_layout_of`)."""
  layout = table_layout_of(_values(table))
  return {"row_shards": layout.num_shards, "rows_per_shard": layout.rows_per_shard}


def saved_table_layout(meta: dict[str, Any], saved_rows: int) -> sharded_cache.SlotLayout:
  """The layout a dense checkpoint's table was saved in (`TABLE_LAYOUT_KEY`; a checkpoint
  without it holds the whole `[saved_rows, E]` table in row order)."""
  entry = meta.get(TABLE_LAYOUT_KEY)
  if entry is None:
    return sharded_cache.SlotLayout(1, saved_rows)
  return sharded_cache.SlotLayout(int(entry["row_shards"]), int(entry["rows_per_shard"]))


def pure_params(tree):
  """Orbax's restored `nnx.State` -> a pure dict (`nnx.to_pure_dict`'s form): `{'value': x}`
  leaves unwrapped, digit keys (layer indices) as ints."""
  if isinstance(tree, dict):
    if set(tree) == {"value"}:
      return tree["value"]
    return {int(k) if isinstance(k, str) and k.isdigit() else k: pure_params(v)
            for k, v in tree.items()}
  return tree


def _restore_numpy(directory: str) -> dict[str, Any]:
  """The orbax tree in `directory` as numpy arrays, whatever mesh saved it (no target)."""
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    meta = checkpointer.metadata(directory).item_metadata.tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    return checkpointer.restore(directory, args=ocp.args.PyTreeRestore(restore_args=args))
  finally:
    checkpointer.close()


class CheckpointTable:
  """A checkpoint's embedding table: rows [V, E] and their optimizer slots [V, S].

  Read chunk by chunk (`CHUNK_ROWS` rows; memory stays one chunk for the cache backend).

  Args:
    num_rows: V.
    width: E.
    slot_width: S (0 for SGD).
    read_chunk: chunk k -> (values [n, E], slots [n, S]) of rows [k * CHUNK_ROWS, + n).
    where: the checkpoint (for error messages).
    dtype: the rows' dtype as trained (`embedding.dtype`); values come back in it.
  """

  def __init__(self, num_rows: int, width: int, slot_width: int,
               read_chunk: Callable[[int], Rows], where: str, dtype=np.float32):
    self.num_rows, self.width, self.slot_width = int(num_rows), int(width), int(slot_width)
    self.dtype = row_dtype.row_dtype(dtype, f"{where}: table dtype")
    self.num_chunks = -(-self.num_rows // CHUNK_ROWS)
    self._read_chunk, self.where = read_chunk, where

  def chunk(self, k: int) -> Rows:
    """(values [n, E] `dtype`, slots [n, S] float32) of rows `[k * CHUNK_ROWS, + n)`."""
    if not 0 <= k < self.num_chunks:
      raise ValueError(f"{self.where}: chunk {k} is outside a table of {self.num_rows} rows")
    values, slots = self._read_chunk(k)
    return values.astype(self.dtype, copy=False), slots

  def chunks(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first row, values [n, E], slots [n, S]) of every chunk, in row order."""
    for k in range(self.num_chunks):
      yield (k * CHUNK_ROWS, *self.chunk(k))

  def rows(self, ids) -> Rows:
    """(values [N, E] `dtype`, slots [N, S] float32) of rows `ids` ([N] ints in [0, V), repeats
    allowed).

    Each chunk holding a requested row is read once.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
      raise ValueError(f"{self.where}: row ids must be a 1-D integer array, got {ids.dtype} "
                       f"{ids.shape}")
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= self.num_rows):
      bad = ids[(ids < 0) | (ids >= self.num_rows)][0]
      raise ValueError(f"{self.where}: row id {bad} is outside [0, {self.num_rows})")
    values = np.empty((ids.size, self.width), self.dtype)
    slots = np.empty((ids.size, self.slot_width), np.float32)
    chunk_of = ids // CHUNK_ROWS
    order = np.argsort(chunk_of, kind="stable")
    ks, starts = np.unique(chunk_of[order], return_index=True)
    for k, a, b in zip(ks.tolist(), starts, [*starts[1:], ids.size], strict=True):
      sel = order[a:b]
      chunk_values, chunk_slots = self.chunk(k)
      local = ids[sel] - k * CHUNK_ROWS
      values[sel], slots[sel] = chunk_values[local], chunk_slots[local]
    return values, slots


def _device_table(dense: dict[str, Any], where: str, meta: dict[str, Any]) -> CheckpointTable:
  """The device backend's table, held whole in the dense state (a row-sharded table's rows
  put back in row order, its padding rows past the `fields`' rows dropped)."""
  values = row_dtype.from_storage(dense["table"]["values"])  # uint16: bfloat16 bits
  dtype = row_dtype.row_dtype(values.dtype, f"{where}: table values dtype")
  slots = dense["table"]["opt_slots"]  # None: SGD's [V, 0] slots (orbax saves no empty array)
  slots = np.zeros((values.shape[0], 0), np.float32) if slots is None else np.asarray(slots)
  saved = saved_table_layout(meta, values.shape[0])
  if saved.num_shards > 1:
    rows = sum(int(f["rows"]) for f in meta["fields"]) if "fields" in meta else None
    values, slots = (row_sharded_table.to_logical(x, saved, rows) for x in (values, slots))

  def read_chunk(k: int) -> Rows:
    rows = slice(k * CHUNK_ROWS, (k + 1) * CHUNK_ROWS)
    return values[rows], slots[rows]

  return CheckpointTable(values.shape[0], values.shape[1], slots.shape[1], read_chunk, where,
                         dtype)


def _initial_slot_row(manifest: dict[str, Any], path: str) -> np.ndarray:
  """[S] slots of a never-written row: recorded in the table manifest, or (checkpoints
  saved before it was) derived from the run's `config.json` beside `checkpoints/`."""
  if "initial_slot_row" in manifest:
    return np.asarray(manifest["initial_slot_row"], np.float32).reshape(manifest["slot_width"])
  config_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))),
                             "config.json")
  try:
    with open(config_path, encoding="utf-8") as f:
      embedding = ml_collections.ConfigDict(json.load(f)).embedding
    row = row_optimizers.row_optimizer_from_config(embedding).initial_slot_row(manifest["width"])
  except (OSError, ValueError, AttributeError, KeyError) as err:
    raise ValueError(f"{os.path.join(path, TABLE_DIR)}: the table manifest does not record the "
                     f"initial optimizer slots and {config_path} cannot give them: {err}") from err
  return np.asarray(row, np.float32).reshape(manifest["slot_width"])


def _host_table(path: str) -> CheckpointTable:
  """The cache backend's host-table chunks (every shard), unwritten rows at their initial value."""
  reader = table_shards.ShardedTableReader(os.path.join(path, TABLE_DIR))
  m = reader.manifest
  width, slot_width, num_rows = m["width"], m["slot_width"], m["num_rows"]
  initial_slots = _initial_slot_row(m, path)
  tables = host_table_files.meta_tables(m)  # per-table initial rows, when recorded
  stored = set(reader.chunks)

  def read_chunk(k: int) -> Rows:
    lo = k * CHUNK_ROWS
    n = min(CHUNK_ROWS, num_rows - lo)
    ids = np.arange(lo, lo + n, dtype=np.int64)
    if tables is not None:
      values, slots = init_table_rows(m["seed"], ids, width, tables)
    else:
      values = init_rows(m["seed"], 0, ids, width, m["init_stddev"])
      slots = np.broadcast_to(initial_slots, (n, slot_width)).copy()
    if k in stored:
      stored_values, stored_slots, written = reader.read(k)
      values[written], slots[written] = stored_values[written], stored_slots[written]
    return values, slots

  # Rows are stored as float32 (exact for half-width rows); initial rows round to the dtype.
  return CheckpointTable(num_rows, width, slot_width, read_chunk, path,
                         m.get("dtype", "float32"))


class Checkpoint:
  """A committed checkpoint opened for reading (`open_checkpoint`).

  Args:
    path: the `step_<N>` directory.
    meta: its meta.json (`layout.read_meta` or `layout.verify`).
  """

  def __init__(self, path: str, meta: dict[str, Any]):
    self.path, self.meta = path, meta
    self._dense: dict[str, Any] | None = None
    self._table: CheckpointTable | None = None

  @property
  def step(self) -> int:
    """Steps taken (= training batches consumed) when it was saved."""
    return int(self.meta["step"])

  @property
  def table_kind(self) -> str:
    """Where the table is: "dense" (device backend), "host_chunks" or "host_shards" (cache)."""
    return self.meta.get("table", "dense")

  def require_table_kind(self, kinds: tuple[str, ...]) -> None:
    """Raises ValueError naming meta.json unless the table is held as one of `kinds`."""
    if self.table_kind not in kinds:
      raise ValueError(f"{os.path.join(self.path, layout.META_FILE)}: the checkpoint holds its "
                       f"table as {self.table_kind!r}; this run's backend needs one of {kinds} "
                       "(same embedding.backend as the run that saved it)")

  def dense(self) -> dict[str, Any]:
    """The dense state `{"step", "params", "opt_state"[, "table"]}` as numpy trees (orbax's
    nesting; zero-size arrays read as None). Read once, then kept."""
    if self._dense is None:
      self._dense = _restore_numpy(os.path.join(self.path, DENSE_DIR))
    return self._dense

  @property
  def params(self):
    """The model's params as a pure dict of numpy arrays (`nnx.to_pure_dict`'s form)."""
    return pure_params(self.dense()["params"])

  @property
  def opt_state(self):
    """The dense optimizer's state as saved (numpy leaves; tuples read back as lists)."""
    return self.dense()["opt_state"]

  @property
  def table(self) -> CheckpointTable:
    """The embedding table (either backend), read lazily chunk by chunk."""
    if self._table is None:
      if self.table_kind in HOST_TABLE_KINDS:
        self._table = _host_table(self.path)
      else:
        self._table = _device_table(self.dense(), self.path, self.meta)
    return self._table

  def restore_dense(self, target: dict[str, Any],
                    checkpointer: ocp.StandardCheckpointer | None = None) -> dict[str, Any]:
    """The dense state restored into `target`'s shapes, dtypes and shardings (any mesh).

    Args:
      target: a tree like the saved one (zero-size arrays included) of placed arrays.
      checkpointer: the orbax checkpointer to restore with (the trainer's, which every
        process of a multi-process run calls together); None: a new one, then closed.

    Raises:
      ValueError: the saved state does not fit `target` (orbax's message).
    """
    own = checkpointer is None
    orbax = ocp.StandardCheckpointer() if checkpointer is None else checkpointer
    try:
      restored = orbax.restore(os.path.join(self.path, DENSE_DIR),
                               _abstract(without_empty(target)))
    finally:
      if own:
        orbax.close()
    return _with_empty(restored, target)


def table_move(ckpt: Checkpoint, orbax: ocp.StandardCheckpointer, table):
  """None when the checkpoint's device table has `table`'s layout (restored in place), else
  (numpy restore target of the saved arrays, saved table -> `table`'s layout and shardings):
  a row-sharded table restored on another device count or as the replicated one, and back.
  """
  saved_rows = orbax.metadata(os.path.join(ckpt.path, DENSE_DIR)).item_metadata.tree
  saved_rows = int(saved_rows["table"]["values"].shape[0])
  saved = saved_table_layout(ckpt.meta, saved_rows)
  mine = table_layout_of(_values(table))
  if saved == mine:
    return None

  def place(saved_table):
    def move(x, like):
      rows = row_sharded_table.relayout(np.asarray(x), saved, mine)
      return jax.make_array_from_callback(rows.shape, like.sharding, lambda index: rows[index])

    return jax.tree.map(move, saved_table, table)

  logging.info("%s: table saved as %d x %d rows, restored as %d x %d", ckpt.path,
               saved.num_shards, saved.rows_per_shard, mine.num_shards, mine.rows_per_shard)
  return jax.tree.map(lambda x: np.zeros((saved.num_slots, *x.shape[1:]), x.dtype), table), place


def _checkpoint_root(path: str) -> str | None:
  """The `checkpoints/` directory `path` names (a workdir or the directory itself), or None."""
  below = os.path.join(path, layout.CHECKPOINT_DIR)
  if os.path.isdir(below):
    return below
  return path if layout.committed_steps(path) else None


def open_checkpoint(path: str, verify: bool = True) -> Checkpoint:
  """Opens a checkpoint for reading; nothing is loaded until asked for.

  Args:
    path: a `step_<N>` checkpoint directory, or a workdir (or its `checkpoints/`): then
      its newest checkpoint that verifies (corrupt newer ones are skipped with a
      warning, never renamed).
    verify: check every file's size and CRC-32 now (`layout.verify`). False: only
      meta.json's own CRC-32; the table files are still checked as they are read.

  Raises:
    FileNotFoundError: `path` holds no checkpoint.
    layout.CorruptCheckpointError: naming the bad file (every checkpoint of a workdir
      is corrupt, or the given one is).
  """
  path = os.fspath(path)
  if os.path.isfile(os.path.join(path, layout.META_FILE)):
    return Checkpoint(path, layout.verify(path) if verify else layout.read_meta(path))
  root = _checkpoint_root(path)
  if root is None:
    raise FileNotFoundError(f"{path}: no checkpoint here (neither a checkpoint directory nor a "
                            "workdir with one; train with --config.checkpoint.every_steps=K)")
  found, bad = layout.newest_good(root)
  for _, why in bad:
    logging.warning("skipping a corrupt checkpoint: %s", why)
  if found is None and not bad:
    raise FileNotFoundError(f"{root}: no committed checkpoint (train with "
                            "--config.checkpoint.every_steps=K)")
  if found is None:
    raise layout.CorruptCheckpointError(f"every checkpoint under {root} is corrupt:\n  "
                                        + "\n  ".join(why for _, why in bad))
  return Checkpoint(found, layout.read_meta(found))


def with_empty_leaves(params, model_params):
  """`params` with a zero array for each leaf the checkpoint restored as None where the
  model's leaf (`model_params`, arrays or shape structs) is empty: orbax restores a zero-size
  array (a model's dense kernel when the data has no dense features) as None."""
  if isinstance(params, dict):
    return {k: with_empty_leaves(v, model_params.get(k) if isinstance(model_params, dict)
                                 else None) for k, v in params.items()}
  shape = getattr(model_params, "shape", None)
  if params is None and shape is not None and int(np.prod(shape)) == 0:
    return np.zeros(shape, getattr(model_params, "dtype", np.float32))
  return params

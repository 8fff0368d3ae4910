"""Crash-safe checkpoints of a training run: `WORKDIR/checkpoints/step_<N>/`.

One checkpoint is one directory, made visible by a single rename:

  step_00000040/
    dense/        orbax `StandardCheckpointer`: {step, params, opt_state} and, for the
                  device backend, the whole embedding table (rows + optimizer slots)
    table/        cache backend: the host table in chunks (`embedding.table_checkpoint`),
                  only chunks written since the previous checkpoint are new files
    meta.json     the step, batches consumed and whatever the loop adds (eval history, ...)

A save writes everything into `tmp.step_<N>.<pid>/`, fsyncs every file and directory,
then renames it to `step_<N>` and fsyncs `checkpoints/`; older checkpoints beyond
`keep` are deleted only after that. A crash at any point leaves every earlier
checkpoint untouched (leftover `tmp.*` directories are ignored and removed by the
next save). Restores use an abstract target built from the caller's state, so the
number of devices and the sharding may differ from the run that saved.

Corruption (a truncated or altered file) is detected before anything is loaded:
`meta.json` carries its own CRC-32 plus the size and CRC-32 of every file of `dense/`
and of `table/manifest.json`, whose entries in turn give each chunk's size and CRC-32
(orbax itself checks no checksums). `find_resumable` walks the checkpoints newest
first, moves a corrupt one aside to `corrupt.step_<N>` with a warning naming the bad
file, and resumes from the newest good one; if none is good it raises, naming every
bad file.

Saving does not stall training for the table's files: `save` takes the dense state
(orbax, small) and a copy-on-write snapshot of the host table synchronously, then
writes the table files, `meta.json` and the rename on a background thread while the
next steps run (`async_table=True`). The checkpoint counts only once renamed; the next
`save`, `wait` or `close` waits for it, and a background failure is raised there,
naming the last good checkpoint. The table is saved as row deltas between whole-chunk
bases (`embedding.table_checkpoint`), so a save writes about the rows touched since
the previous one.

The cache backend's device cache is not saved: the loop flushes it to the host
table first (`Backend.sync`), and a fresh, empty cache after a restore gives the same
results because the cache only holds exact copies of host rows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import zlib
from typing import Any, NamedTuple

import jax
from absl import logging
import orbax.checkpoint as ocp

from sfjax.core import digest
from sfjax.core.atomic import atomic_write
from sfjax.core.atomic import fsync_directory
from sfjax.core.errors import ConfigError
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding import table_checkpoint
from sfjax.train.state import TrainState

CHECKPOINT_DIR = "checkpoints"
META_FILE = "meta.json"
FORMAT_NAME = "sfjax.train_checkpoint"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")
_META_CRC = "meta_crc32"


class CorruptCheckpointError(ValueError):
  """A checkpoint file is missing, truncated or altered; the message names the file."""


class CheckpointSaveError(RuntimeError):
  """A background save failed; the message names it and the last good checkpoint."""


SNAPSHOT_BUDGET_BYTES = 1 << 30  # copy-on-write copies held while a table save runs


def settings(config) -> tuple[int, int]:
  """`(checkpoint.every_steps, checkpoint.keep)`; (0, 1) for a config without the block.

  Raises:
    ConfigError: naming the field, for a negative or non-integer value.
  """
  block = config.get("checkpoint") if hasattr(config, "get") else None
  if block is None:
    return 0, 1
  every, keep = block.get("every_steps", 0), block.get("keep", 3)
  for field, value, low in (("every_steps", every, 0), ("keep", keep, 1)):
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      raise ConfigError(f"config field checkpoint.{field}: must be an integer >= {low}, "
                        f"got {value!r}")
  return every, keep


def step_dir_name(step: int) -> str:
  return f"step_{step:08d}"


def committed_steps(root: str | None) -> list[int]:
  """Steps of the complete checkpoints under `root`, ascending ([] if none)."""
  if not root or not os.path.isdir(root):
    return []
  steps = []
  for name in os.listdir(root):
    m = _STEP_DIR.match(name)
    if m and os.path.isfile(os.path.join(root, name, META_FILE)):
      steps.append(int(m.group(1)))
  return sorted(steps)


def latest(root: str | None) -> str | None:
  """Path of the newest complete checkpoint under `root`, or None."""
  steps = committed_steps(root)
  return os.path.join(root, step_dir_name(steps[-1])) if steps else None


def _meta_crc(meta: dict[str, Any]) -> int:
  body = {k: v for k, v in meta.items() if k != _META_CRC}
  return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def read_meta(path: str) -> dict[str, Any]:
  """A checkpoint's `meta.json`, checked against its own CRC-32.

  Raises:
    CorruptCheckpointError: naming the file, if it does not parse or its CRC differs.
  """
  meta_path = os.path.join(path, META_FILE)
  try:
    with open(meta_path, encoding="utf-8") as f:
      meta = json.load(f)
  except (OSError, ValueError) as err:
    raise CorruptCheckpointError(f"{meta_path}: unreadable checkpoint metadata: {err}") from err
  if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME \
      or meta.get("version") != FORMAT_VERSION:
    raise CorruptCheckpointError(
        f"{meta_path}: not a {FORMAT_NAME} version {FORMAT_VERSION} checkpoint")
  if _META_CRC in meta and meta[_META_CRC] != _meta_crc(meta):
    raise CorruptCheckpointError(f"{meta_path}: checkpoint metadata is corrupt (CRC-32 mismatch)")
  return meta


def _digests(tmp: str, with_table: bool) -> dict[str, dict[str, int]]:
  """Digests of every file of `dense/` (and `table/manifest.json`), keyed by relative path."""
  files = {}
  for dirpath, _, filenames in os.walk(os.path.join(tmp, "dense")):
    for name in filenames:
      full = os.path.join(dirpath, name)
      files[os.path.relpath(full, tmp)] = digest.file_digest(full)
  if with_table:
    rel = os.path.join("table", table_checkpoint.MANIFEST_FILE)
    files[rel] = digest.file_digest(os.path.join(tmp, rel))
  return dict(sorted(files.items()))


def verify(path: str) -> dict[str, Any]:
  """Checks every file of checkpoint `path` (size and CRC-32) without loading it.

  Reads each file once: `meta.json`, the orbax files, the table manifest and every
  table chunk. Returns the metadata.

  Raises:
    CorruptCheckpointError: naming the first missing, truncated or altered file.
  """
  meta = read_meta(path)
  for rel, want in meta.get("files", {}).items():
    full = os.path.join(path, rel)
    try:
      got = digest.file_digest(full)
    except OSError as err:
      raise CorruptCheckpointError(f"{full}: unreadable checkpoint file: {err}") from err
    if got != want:
      raise CorruptCheckpointError(f"{full}: checkpoint file is corrupt (size {got['bytes']} vs "
                                   f"{want['bytes']}, crc32 {got['crc32']} vs {want['crc32']})")
  if meta.get("table") == "host_chunks":
    try:
      table_checkpoint.verify_table(os.path.join(path, "table"))
    except (OSError, ValueError) as err:
      raise CorruptCheckpointError(str(err)) from err
  return meta


def find_resumable(root: str | None) -> str | None:
  """The newest checkpoint under `root` that passes `verify`, or None if there is none.

  Corrupt checkpoints newer than it are renamed `corrupt.step_<N>` (kept for inspection,
  never pruned) with a warning naming the bad file.

  Raises:
    CorruptCheckpointError: checkpoints exist but every one is corrupt; the message names
      each bad file and how to proceed (nothing is renamed).
  """
  bad: list[tuple[str, str]] = []
  for step in reversed(committed_steps(root)):
    path = os.path.join(root, step_dir_name(step))
    try:
      verify(path)
    except CorruptCheckpointError as err:
      bad.append((path, str(err)))
      continue
    for bad_path, why in bad:
      aside = os.path.join(root, "corrupt." + os.path.basename(bad_path))
      shutil.rmtree(aside, ignore_errors=True)
      os.rename(bad_path, aside)
      logging.warning("checkpoint %s is corrupt (%s); moved to %s, resuming from the previous "
                      "good checkpoint %s", bad_path, why, aside, path)
    if bad:
      fsync_directory(root)
    return path
  if bad:
    raise CorruptCheckpointError(
        f"every checkpoint under {root} is corrupt:\n  " + "\n  ".join(w for _, w in bad)
        + f"\nRestore them from a copy, or move {root} aside to train again from step 0.")
  return None


def _fsync_tree(path: str) -> None:
  """fsyncs every file and directory under `path` (orbax's files included)."""
  for dirpath, _, filenames in os.walk(path):
    for name in filenames:
      fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    fsync_directory(dirpath)


def _without_empty(tree):
  """`tree` with zero-size arrays (SGD's [V, 0] slots) as None: orbax refuses to save them."""
  return jax.tree.map(lambda x: x if x.size else None, tree)


def _with_empty(restored, target):
  """`restored` (from a tree `_without_empty` made) with `target`'s zero-size arrays put back."""
  leaves, _ = jax.tree_util.tree_flatten(restored, is_leaf=lambda x: x is None)
  target_leaves, treedef = jax.tree_util.tree_flatten(target)
  return jax.tree_util.tree_unflatten(
      treedef, [t if r is None else r for r, t in zip(leaves, target_leaves)])


def _abstract(tree):
  """Shapes, dtypes and shardings of `tree` (the restore target; no data)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class Restored(NamedTuple):
  """A loaded checkpoint.

  Attributes:
    step: steps taken (= training batches consumed) when it was saved.
    state: the TrainState, placed like the target given to `restore`.
    meta: the checkpoint's `meta.json` (the loop's fields included).
    path: the checkpoint directory.
  """

  step: int
  state: TrainState
  meta: dict[str, Any]
  path: str


class Checkpointer:
  """Saves and restores a run's checkpoints under `root`.

  Args:
    root: the checkpoints directory (created on the first save).
    keep: newest checkpoints kept.
    host_table: the cache backend's host table (saved in chunks and row deltas); None
      when the table is part of the TrainState (device backend).
    async_table: write the host table's files on a background thread (the save returns
      once the dense state and a copy-on-write snapshot are taken).
    snapshot_budget_bytes: most bytes of chunks copied aside while a save runs; past
      it, a write-back waits for the writer (memory stays bounded, results exact).
    compact_ratio: row deltas beyond this fraction of the base's bytes -> a new base.
  """

  def __init__(self, root: str, keep: int, host_table: host_table_lib.HostTable | None = None,
               async_table: bool = True, snapshot_budget_bytes: int = SNAPSHOT_BUDGET_BYTES,
               compact_ratio: float = table_checkpoint.COMPACT_RATIO):
    self.root, self.keep, self.host_table = root, keep, host_table
    self.async_table = async_table
    self.snapshot_budget_bytes, self.compact_ratio = snapshot_budget_bytes, compact_ratio
    self._orbax = ocp.StandardCheckpointer()
    # The checkpoint the host table's dirty rows and chunks are relative to (None: fresh).
    self._table_base: str | None = None
    self._thread: threading.Thread | None = None
    self._error: tuple[str, BaseException] | None = None  # (path, error) of a failed save
    self.last_save: dict[str, Any] = {}  # the last committed save's kind, rows and seconds

  def _dense(self, state: TrainState) -> dict[str, Any]:
    tree = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
    if self.host_table is None:
      tree["table"] = state.table
    return tree

  def save(self, state: TrainState, meta: dict[str, Any]) -> str:
    """Saves `state` (the host table must be synced) plus `meta` (JSON).

    Waits for the previous save first. With `async_table` the table's files are
    written in the background: the returned path exists once `wait()` returns.

    Returns:
      The checkpoint's final path.

    Raises:
      CheckpointSaveError: the previous (background) save failed.
    """
    self.wait()
    # A copy now: the background writer must not see the caller's lists grow afterwards.
    meta = json.loads(json.dumps(meta))
    step = int(state.step)
    os.makedirs(self.root, exist_ok=True)
    final = os.path.join(self.root, step_dir_name(step))
    tmp = os.path.join(self.root, f"tmp.{step_dir_name(step)}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    plan = snapshot = None
    t0 = time.perf_counter()
    try:
      self._orbax.save(os.path.join(tmp, "dense"), _without_empty(self._dense(state)))
      self._orbax.wait_until_finished()
      if self.host_table is not None:
        base = os.path.join(self._table_base, "table") if self._table_base else None
        plan = table_checkpoint.plan_save(self.host_table, base, self.compact_ratio)
        plan, snapshot = table_checkpoint.capture(self.host_table, plan,
                                                  self.snapshot_budget_bytes)
    except BaseException:
      self._abandon(tmp, plan, snapshot)
      raise
    job = (step, tmp, final, meta, plan, snapshot, t0)
    if self.async_table and self.host_table is not None:
      self._thread = threading.Thread(target=self._finish_in_background, args=job,
                                      name=f"checkpoint-{step}", daemon=True)
      self._thread.start()
    else:
      self._finish(*job)
    return final

  def _abandon(self, tmp: str, plan, snapshot) -> None:
    """Undoes an uncommitted save: the next save must write its rows again."""
    if snapshot is not None:
      snapshot.close()
    if plan is not None:
      table_checkpoint.unplan_save(self.host_table, plan)
    shutil.rmtree(tmp, ignore_errors=True)

  def _finish_in_background(self, *job) -> None:
    try:
      self._finish(*job)
    except BaseException as err:  # pylint: disable=broad-except
      self._error = (job[2], err)  # raised by the next save / wait

  def _finish(self, step: int, tmp: str, final: str, meta: dict[str, Any], plan, snapshot,
              t0: float) -> None:
    """Writes the table files and metadata, then commits by one rename."""
    try:
      if plan is not None:
        base = os.path.join(self._table_base, "table") if self._table_base else None
        table_checkpoint.write_table(snapshot, self.host_table, os.path.join(tmp, "table"),
                                     plan, base)
        snapshot.close()
      full_meta = dict(meta, format=FORMAT_NAME, version=FORMAT_VERSION, step=step,
                       batches_consumed=step,
                       table="host_chunks" if self.host_table is not None else "dense",
                       files=_digests(tmp, self.host_table is not None))
      full_meta[_META_CRC] = _meta_crc(full_meta)
      atomic_write(os.path.join(tmp, META_FILE), json.dumps(full_meta))
      _fsync_tree(tmp)
      trash = None
      if os.path.exists(final):  # the same step saved again: swap, never leave a gap
        trash = os.path.join(self.root, f"old.{step_dir_name(step)}.{os.getpid()}")
        os.rename(final, trash)
      os.rename(tmp, final)
      fsync_directory(self.root)
      if trash:
        shutil.rmtree(trash, ignore_errors=True)
    except BaseException:
      self._abandon(tmp, plan, snapshot)
      raise
    self._table_base = final
    self.last_save = {"path": final, "kind": plan.kind if plan is not None else "dense",
                      "rows": int(plan.rows.size) if plan is not None else 0,
                      "chunks": int(plan.chunks.size) if plan is not None else 0,
                      "seconds": time.perf_counter() - t0,
                      "snapshot_copies": snapshot.copies_made if snapshot is not None else 0,
                      "snapshot_waits": snapshot.waits if snapshot is not None else 0}
    self._prune()

  def wait(self) -> str | None:
    """Waits for a background save; returns the newest committed checkpoint (or None).

    Raises:
      CheckpointSaveError: the background save failed (its rows stay dirty, so the next
        save writes them); the message names the last good checkpoint.
    """
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self._error is not None:
      (path, err), self._error = self._error, None
      good = latest(self.root)
      raise CheckpointSaveError(f"checkpoint {path} was not saved ({type(err).__name__}: {err}); "
                                f"the last good checkpoint is {good or 'none'}") from err
    return latest(self.root)

  def _prune(self) -> None:
    """Deletes checkpoints beyond `keep` and leftovers of interrupted saves."""
    steps = committed_steps(self.root)
    for step in steps[:-self.keep]:
      shutil.rmtree(os.path.join(self.root, step_dir_name(step)), ignore_errors=True)
    for name in os.listdir(self.root):
      if name.startswith(("tmp.", "old.")):
        shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

  def restore(self, path: str, target: TrainState) -> Restored:
    """Loads checkpoint `path` into the shapes/shardings of `target` (and the host table).

    For the cache backend the host table must be freshly created; `target.table` (the
    empty cache) is kept. Waits for a background save first.
    """
    self.wait()
    meta = read_meta(path)
    want = "host_chunks" if self.host_table is not None else "dense"
    if meta.get("table") != want:
      raise ValueError(f"{os.path.join(path, META_FILE)}: the checkpoint holds its table as "
                       f"{meta.get('table')!r}; this run's backend needs {want!r} (same "
                       "embedding.backend as the run that saved it)")
    try:
      target_dense = self._dense(target)
      dense = _with_empty(self._orbax.restore(os.path.join(path, "dense"),
                                              _abstract(_without_empty(target_dense))),
                          target_dense)
    except ValueError as err:
      raise ValueError(f"{path}: does not fit this run's state (saved by a different model or "
                       f"config?): {err}") from err
    if self.host_table is not None:
      table_checkpoint.load_table(self.host_table, os.path.join(path, "table"))
      self._table_base = path
    state = TrainState(dense["step"], dense["params"], dense["opt_state"],
                       dense.get("table", target.table))
    return Restored(int(meta["step"]), state, meta, path)

  def close(self) -> None:
    """Waits for a background save (a failure is logged, not raised: call `wait` for that)
    and releases orbax."""
    try:
      self.wait()
    except CheckpointSaveError as err:
      logging.error("%s", err)
    finally:
      self._orbax.close()

"""Crash-safe checkpoints of a training run: `WORKDIR/checkpoints/step_<N>/`.

One checkpoint is one directory, made visible by a single rename:

  step_00000040/
    dense/        orbax `StandardCheckpointer`: {step, params, opt_state} and, for the
                  device backend, the whole embedding table (rows + optimizer slots; a
                  row-sharded one as its shards hold it: `reader.table_move`)
    table/        cache backend: the host table in chunks and row deltas
                  (`sfjax.checkpoint.table_format`): only what was written since the
                  previous checkpoint is new files
    meta.json     the step, batches consumed and whatever the loop adds (eval history, the
                  run's fingerprint that a resume checks: `sfjax.train.resume_check`)

A save writes everything into `tmp.step_<N>.<pid>/`, fsyncs every file and directory,
then renames it to `step_<N>` and fsyncs `checkpoints/`; older checkpoints beyond
`keep` are deleted only after that. A crash at any point leaves every earlier
checkpoint untouched (leftover `tmp.*` directories are ignored and removed by the
next save of their owner, or once their owner's pid has ended: never another live run's). Restores open the checkpoint like any reader (`sfjax.checkpoint.reader`)
and restore into an abstract target built from the caller's state, so the number of
devices and the sharding may differ from the run that saved.

Corruption (a truncated or altered file) is detected before anything is loaded
(`sfjax.checkpoint.layout`, re-exported here):
`meta.json` carries its own CRC-32 plus the size and CRC-32 of every file of `dense/`
and of `table/manifest.json`, whose entries in turn give each chunk's size and CRC-32
(orbax itself checks no checksums). `find_resumable` walks the checkpoints newest
first, moves a corrupt one aside to `corrupt.step_<N>` with a warning naming the bad
file, and resumes from the newest good one; if none is good it raises, naming every
bad file.

What a save writes of the host table is tracked by a `ChangeTracker` the checkpointer
registers as the table's write observer (`sfjax.checkpoint.change_tracking`).
Saving does not stall training for the table's files: `save` takes the dense state
(orbax, small) and a copy-on-write snapshot of the host table synchronously, then
writes the table files, `meta.json` and the rename on a background thread while the
next steps run (`async_table=True`). The checkpoint counts only once renamed; the next
`save`, `wait` or `close` waits for it, and a background failure is raised there,
naming the last good checkpoint. The table is saved as row deltas between whole-chunk
bases (`sfjax.checkpoint.table_format`), so a save writes about the rows touched since
the previous one.

The cache backend's device cache is not saved: the loop flushes it to the host
table first (`Backend.sync`), and a fresh, empty cache after a restore gives the same
results because the cache only holds exact copies of host rows.

Runs over P > 1 processes (`jax.distributed`; the checkpoint directory must be on a
file system every process sees):

  step_00000040/
    dense/                  orbax, written by every process together (the state is
                            replicated; orbax writes each array once and commits on
                            process 0)
    table/process_<p>_of_P/ process p's host-table rows (id % P == p), each an ordinary
                            table checkpoint (`sfjax.checkpoint.table_shards`)
    meta.json               `processes`: P, the digests of dense/ and every shard's manifest

A save is a protocol every process runs in step: process 0 makes `tmp.step_<N>.of<P>/`;
all write the dense state and their own shard; an exchange of success flags
(`distributed.failed_processes`, also the barrier) confirms every shard is durable
(fsynced); only then process 0 writes meta.json and renames (the commit), and a second
flag exchange tells every process the outcome. Each exchange is a timed barrier
(`sfjax.parallel.barriers`: a process that does not arrive within `distributed.timeout_s`
is named in a `PeerFailureError`), and the save runs in the watchdog's phase
'checkpoint step_<N>' (a peer dying meanwhile ends this process, naming both). A
failure anywhere abandons the temporary directory on every process (their rows stay
dirty) and raises
`CheckpointSaveError` everywhere; earlier checkpoints are never touched. These saves
are synchronous (`async_table` is ignored): a background thread's collectives could
interleave with the training step's on the other processes.

A checkpoint of P processes restores on P' (1 -> 2, 2 -> 1, ...): the dense state
through orbax's abstract target, the table through `table_shards.load_owned` (each
process keeps the stored rows it owns under P'). On the same P each process reads
only its own shard and the next save may be a delta; on another count the next save
is a base. `find_resumable` runs on process 0 and its answer is broadcast.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from absl import logging

from sfjax.checkpoint import layout as checkpoint_files
from sfjax.checkpoint import reader, table_format, table_shards
from sfjax.checkpoint.change_tracking import ChangeTracker

# The on-disk format, verification and the choice of a resume point (re-exported: they
# are part of this module's API).
from sfjax.checkpoint.layout import CHECKPOINT_DIR as CHECKPOINT_DIR
from sfjax.checkpoint.layout import META_FILE as META_FILE
from sfjax.checkpoint.layout import CorruptCheckpointError as CorruptCheckpointError
from sfjax.checkpoint.layout import committed_steps as committed_steps
from sfjax.checkpoint.layout import find_resumable as find_resumable
from sfjax.checkpoint.layout import latest as latest
from sfjax.checkpoint.layout import read_meta as read_meta
from sfjax.checkpoint.layout import step_dir_name as step_dir_name
from sfjax.checkpoint.layout import verify as verify
from sfjax.core.atomic import atomic_write, fsync_directory
from sfjax.core.errors import ConfigError
from sfjax.embedding import host_table as host_table_lib
from sfjax.parallel import distributed, watchdog

# The state is the train package's TrainState (step, params, opt_state, table): a
# NamedTuple this layer reads by field and rebuilds with `_replace`, so it sits below train/.
_TrainState = Any

class CheckpointSaveError(RuntimeError):
  """A background save failed; the message names it and the last good checkpoint."""


_SNAPSHOT_BUDGET_BYTES = 1 << 30  # copy-on-write copies held while a table save runs


def checkpoint_settings(config) -> tuple[int, int]:
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


class Restored(NamedTuple):
  """A loaded checkpoint.

  Attributes:
    step: steps taken (= training batches consumed) when it was saved.
    state: the TrainState, placed like the target given to `restore`.
    meta: the checkpoint's `meta.json` (the loop's fields included).
    path: the checkpoint directory.
  """

  step: int
  state: _TrainState
  meta: dict[str, Any]
  path: str


class Checkpointer:
  """Saves and restores a run's checkpoints under `root`.

  Args:
    root: the checkpoints directory (created on the first save).
    keep: newest checkpoints kept.
    host_table: the cache backend's host table (saved in chunks and row deltas; its
      writes are tracked from now on, until `close`); None when the table is part of
      the TrainState (device backend).
    async_table: write the host table's files on a background thread (the save returns
      once the dense state and a copy-on-write snapshot are taken). Ignored (synchronous)
      in a run over several processes.
    snapshot_budget_bytes: most bytes of chunks copied aside while a save runs; past
      it, a write-back waits for the writer (memory stays bounded, results exact).
    compact_ratio: row deltas beyond this fraction of the base's bytes -> a new base.
  """

  def __init__(self, root: str, keep: int, host_table: host_table_lib.HostTable | None = None,
               async_table: bool = True, snapshot_budget_bytes: int = _SNAPSHOT_BUDGET_BYTES,
               compact_ratio: float = table_format.COMPACT_RATIO):
    self.root, self.keep, self.host_table = root, keep, host_table
    # What the next save must write: the table's writes since the last one.
    self.tracker = ChangeTracker(host_table) if host_table is not None else None
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.async_table = async_table and self.process_count == 1
    self.snapshot_budget_bytes, self.compact_ratio = snapshot_budget_bytes, compact_ratio
    self._orbax = ocp.StandardCheckpointer()
    # The checkpoint the host table's dirty rows and chunks are relative to (None: fresh,
    # or restored from another process count: the next save writes a base).
    self._table_base: str | None = None
    self._thread: threading.Thread | None = None
    self._error: tuple[str, BaseException] | None = None  # (path, error) of a failed save
    self.last_save: dict[str, Any] = {}  # the last committed save's kind, rows and seconds

  def _dense(self, state: _TrainState) -> dict[str, Any]:
    tree = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
    if self.host_table is None:
      tree["table"] = state.table
    return tree

  def _previous_shard(self) -> str | None:
    """This process's table directory in the checkpoint the next save is relative to."""
    if self._table_base is None:
      return None
    return table_shards.shard_directory(os.path.join(self._table_base, reader.TABLE_DIR),
                                        self.process_index, self.process_count)

  def save(self, state: _TrainState, meta: dict[str, Any]) -> str:
    """Saves `state` (the host table must be synced) plus `meta` (JSON).

    Waits for the previous save first. With `async_table` the table's files are
    written in the background: the returned path exists once `wait()` returns.
    Several processes: every process calls it (the module docstring's protocol).

    Returns:
      The checkpoint's final path.

    Raises:
      CheckpointSaveError: the previous (background) save failed, or (several
        processes) a process failed this save.
    """
    self.wait()
    # A copy now: the background writer must not see the caller's lists grow afterwards.
    meta = json.loads(json.dumps(meta))
    if self.host_table is None and state.table is not None:  # saved as its shards hold it
      meta[reader.TABLE_LAYOUT_KEY] = reader.table_layout_entry(state.table)
    step = int(state.step)
    final = os.path.join(self.root, step_dir_name(step))
    if self.process_count > 1:
      with watchdog.phase(f"checkpoint {step_dir_name(step)}"):
        path = self._save_everywhere(state, meta, step, final)
      watchdog.set_base_phase(f"training after checkpoint {step_dir_name(step)}")
      return path
    os.makedirs(self.root, exist_ok=True)
    tmp = os.path.join(self.root, f"tmp.{step_dir_name(step)}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    plan = snapshot = None
    t0 = time.perf_counter()
    try:
      self._orbax.save(os.path.join(tmp, reader.DENSE_DIR),
                       reader.without_empty(self._dense(state)))
      self._orbax.wait_until_finished()
      if self.tracker is not None:
        plan = table_format.plan_save(self.tracker, self._previous_shard(), self.compact_ratio)
        plan, snapshot = table_format.capture(self.tracker, plan, self.snapshot_budget_bytes)
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
    if plan is not None and self.tracker is not None:  # a plan exists only with a table
      table_format.unplan_save(self.tracker, plan)
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
      if plan is not None and self.tracker is not None:  # a plan exists only with a table
        table_format.write_table(snapshot, self.tracker.table,
                                 os.path.join(tmp, reader.TABLE_DIR), plan,
                                 self._previous_shard())
        snapshot.close()
      self._commit(step, tmp, final, meta)
    except BaseException:
      self._abandon(tmp, plan, snapshot)
      raise
    self._table_base = final
    self._record_save(final, plan, snapshot, t0)
    self._prune()

  def _record_save(self, final: str, plan, snapshot, t0: float) -> None:
    self.last_save = {"path": final, "kind": plan.kind if plan is not None else "dense",
                      "rows": int(plan.rows.size) if plan is not None else 0,
                      "chunks": int(plan.chunks.size) if plan is not None else 0,
                      "seconds": time.perf_counter() - t0,
                      "snapshot_copies": snapshot.copies_made if snapshot is not None else 0,
                      "snapshot_waits": snapshot.waits if snapshot is not None else 0}

  def _commit(self, step: int, tmp: str, final: str, meta: dict[str, Any]) -> None:
    """Writes meta.json (digests of dense/ and the table manifests), fsyncs `tmp` and
    renames it to `final` (the one step that makes the checkpoint count)."""
    kind = "dense" if self.host_table is None else (
        "host_chunks" if self.process_count == 1 else "host_shards")
    full_meta = dict(meta, format=checkpoint_files.FORMAT_NAME,
                     version=checkpoint_files.FORMAT_VERSION, step=step,
                     batches_consumed=step, table=kind, processes=self.process_count,
                     files=checkpoint_files.digests(tmp, self.host_table is not None))
    full_meta[checkpoint_files.META_CRC] = checkpoint_files.meta_crc(full_meta)
    atomic_write(os.path.join(tmp, META_FILE), json.dumps(full_meta))
    checkpoint_files.fsync_tree(tmp)
    trash = None
    if os.path.exists(final):  # the same step saved again: swap, never leave a gap
      trash = os.path.join(self.root, f"old.{step_dir_name(step)}.{os.getpid()}")
      os.rename(final, trash)
    os.rename(tmp, final)
    fsync_directory(self.root)
    if trash:
      shutil.rmtree(trash, ignore_errors=True)

  def _agree(self, what: str, step: int, error: BaseException | None) -> None:
    """Every process's outcome of a save phase (a barrier); raises CheckpointSaveError on
    every process if any failed, naming the processes and the last good checkpoint."""
    failed = distributed.failed_processes(error is None, f"checkpoint {step_dir_name(step)}: {what}")
    if failed:
      good = latest(self.root)
      mine = f" (here: {type(error).__name__}: {error})" if error is not None else ""
      raise CheckpointSaveError(
          f"checkpoint {step_dir_name(step)} was not saved: {what} failed on processes "
          f"{failed}{mine}; the last good checkpoint is {good or 'none'}") from error

  def _save_everywhere(self, state: _TrainState, meta: dict[str, Any], step: int,
                       final: str) -> str:
    """`save` in a run over several processes: every process calls it in step (the
    module docstring's protocol). Synchronous."""
    main = self.process_index == 0
    tmp = os.path.join(self.root, f"tmp.{step_dir_name(step)}.of{self.process_count}")
    t0, plan, snapshot = time.perf_counter(), None, None
    error: BaseException | None = None
    if main:
      try:
        os.makedirs(self.root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed attempt's leftovers
        os.makedirs(tmp)
      except OSError as err:
        error = err
    self._agree("making the temporary directory", step, error)
    try:
      try:
        self._orbax.save(os.path.join(tmp, reader.DENSE_DIR),
                         reader.without_empty(self._dense(state)))
        self._orbax.wait_until_finished()
        if self.tracker is not None:
          shard = table_shards.shard_directory(os.path.join(tmp, reader.TABLE_DIR),
                                               self.process_index, self.process_count)
          os.makedirs(os.path.dirname(shard), exist_ok=True)
          previous = self._previous_shard()
          plan = table_format.plan_save(self.tracker, previous, self.compact_ratio)
          plan, snapshot = table_format.capture(self.tracker, plan, self.snapshot_budget_bytes)
          table_format.write_table(snapshot, self.tracker.table, shard, plan, previous)
          checkpoint_files.fsync_tree(shard)
      except Exception as err:  # pylint: disable=broad-except
        error = err
      self._agree("writing the dense state or a table shard", step, error)
      if main:
        try:
          self._commit(step, tmp, final, meta)
        except Exception as err:  # pylint: disable=broad-except
          error = err
      self._agree("the commit on process 0", step, error)
    except BaseException:
      if snapshot is not None:
        snapshot.close()
      if plan is not None and self.tracker is not None:  # a plan exists only with a table
        table_format.unplan_save(self.tracker, plan)
      if main:
        shutil.rmtree(tmp, ignore_errors=True)
      raise
    if snapshot is not None:
      snapshot.close()
    self._table_base = final
    self._record_save(final, plan, snapshot, t0)
    if main:
      self._prune()
    return final

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
    """Deletes checkpoints beyond `keep` and leftovers of this process's interrupted saves
    (or of ended processes': `layout.removable_leftover`)."""
    steps = committed_steps(self.root)
    for step in steps[:-self.keep]:
      shutil.rmtree(os.path.join(self.root, step_dir_name(step)), ignore_errors=True)
    for name in os.listdir(self.root):
      if checkpoint_files.removable_leftover(name, os.getpid()):
        shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

  def restore(self, path: str, target: _TrainState) -> Restored:
    """Loads checkpoint `path` into the shapes/shardings of `target` (and the host table).

    For the cache backend the host table must be freshly created; `target.table` (the
    empty cache) is kept, and the host table gets the stored rows this process owns,
    whatever process count saved them. Waits for a background save first. Several
    processes: every process calls it.
    """
    self.wait()
    ckpt = reader.open_checkpoint(path, verify=False)  # `find_resumable` verified it
    ckpt.require_table_kind(reader.HOST_TABLE_KINDS if self.host_table is not None
                            else ("dense",))
    tree, moved = self._dense(target), None
    if self.host_table is None and target.table is not None:  # another layout: via the host
      moved = reader.table_move(ckpt, self._orbax, target.table)
      if moved is not None:
        tree["table"] = moved[0]
    try:
      dense = ckpt.restore_dense(tree, self._orbax)
    except ValueError as err:
      raise ValueError(f"{path}: does not fit this run's state (saved by a different model or "
                       f"config?): {err}") from err
    if moved is not None:
      dense["table"] = moved[1](dense["table"])
    if self.host_table is not None:  # the rows this process owns, from every stored shard
      same_layout = table_shards.load_owned(self.host_table, os.path.join(path, reader.TABLE_DIR),
                                            self.process_index, self.process_count, self.tracker)
      self._table_base = path if same_layout else None
    state = target._replace(step=dense["step"], params=dense["params"],
                            opt_state=dense["opt_state"], table=dense.get("table", target.table))
    return Restored(ckpt.step, state, ckpt.meta, path)

  def close(self) -> None:
    """Waits for a background save (a failure is logged, not raised: call `wait` for that),
    stops tracking the host table's writes and releases orbax."""
    try:
      self.wait()
    except CheckpointSaveError as err:
      logging.error("%s", err)
    finally:
      if self.tracker is not None:
        self.tracker.detach()
      self._orbax.close()

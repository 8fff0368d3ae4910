"""What a committed checkpoint is on disk, how it is checked, and where a run resumes.

  checkpoints/
    step_<N>/        a committed checkpoint (`sfjax.checkpoint.checkpointer` writes it): dense/
                     (orbax), table/ (host-table chunks and deltas: directly for one
                     process, `process_<p>_of_<P>/` shards for P), meta.json
    tmp.*  old.*     an interrupted or superseded save (ignored; the next save of its owner
                     removes it, or of another owner once the pid it names has ended)
    corrupt.step_<N> a checkpoint `find_resumable` found damaged (kept, never pruned)

A checkpoint counts once `step_<N>/meta.json` exists (the directory appears by one
rename). meta.json holds its own CRC-32 (`META_CRC`) and the size and CRC-32 of every
dense/ file and every table manifest, whose entries give each chunk's: `verify` checks
them all without loading anything. A read that fails with a transient `OSError` is retried
(`read_retry`); only a missing, truncated or altered file makes a checkpoint corrupt.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from typing import Any

import jax
import numpy as np
from absl import logging

from sfjax.checkpoint import table_format, table_shards
from sfjax.checkpoint.read_retry import MISSING, CheckpointReadError, read_retrying
from sfjax.core import digest
from sfjax.core.atomic import fsync_directory
from sfjax.parallel import distributed

CHECKPOINT_DIR = "checkpoints"
META_FILE = "meta.json"
FORMAT_NAME = "sfjax.train_checkpoint"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")
META_CRC = "meta_crc32"  # meta.json's own CRC-32 field


class CorruptCheckpointError(ValueError):
  """A checkpoint file is missing, truncated or altered; the message names the file."""


def step_dir_name(step: int) -> str:
  """`step_<N>` with N zero-padded to 8 digits: the directory of step N's checkpoint."""
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
  return os.path.join(root, step_dir_name(steps[-1])) if root and steps else None


def meta_crc(meta: dict[str, Any]) -> int:
  """CRC-32 of `meta` without its own CRC field (the value stored under `META_CRC`)."""
  body = {k: v for k, v in meta.items() if k != META_CRC}
  return digest.crc32(json.dumps(body, sort_keys=True).encode())


def read_meta(path: str) -> dict[str, Any]:
  """A checkpoint's `meta.json`, checked against its own CRC-32.

  Raises:
    CorruptCheckpointError: naming the file, if it is missing, does not parse or its CRC
      differs.
    CheckpointReadError: it stayed unreadable through every retry (`read_retry`).
  """
  meta_path = os.path.join(path, META_FILE)
  try:
    meta = json.loads(read_retrying(lambda: _read_text(meta_path), meta_path))
  except (*MISSING, ValueError) as err:
    raise CorruptCheckpointError(f"{meta_path}: unreadable checkpoint metadata: {err}") from err
  if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME \
      or meta.get("version") != FORMAT_VERSION:
    raise CorruptCheckpointError(
        f"{meta_path}: not a {FORMAT_NAME} version {FORMAT_VERSION} checkpoint")
  if META_CRC in meta and meta[META_CRC] != meta_crc(meta):
    raise CorruptCheckpointError(f"{meta_path}: checkpoint metadata is corrupt (CRC-32 mismatch)")
  return meta


def _read_text(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def digests(tmp: str, with_table: bool) -> dict[str, dict[str, int]]:
  """Digests of every file of `dense/` (and of every table shard's manifest.json), keyed
  by relative path."""
  files = {}
  for dirpath, _, filenames in os.walk(os.path.join(tmp, "dense")):
    for name in filenames:
      full = os.path.join(dirpath, name)
      files[os.path.relpath(full, tmp)] = digest.file_digest(full)
  if with_table:
    for shard in table_shards.list_shards(os.path.join(tmp, "table")):
      full = os.path.join(shard.directory, table_format.MANIFEST_FILE)
      files[os.path.relpath(full, tmp)] = digest.file_digest(full)
  return dict(sorted(files.items()))


def verify(path: str) -> dict[str, Any]:
  """Checks every file of checkpoint `path` (size and CRC-32) without loading it.

  Reads each file once: `meta.json`, the orbax files, the table manifest and every
  table chunk. Returns the metadata.

  Raises:
    CorruptCheckpointError: naming the first missing, truncated or altered file.
    CheckpointReadError: a file stayed unreadable through every retry (not corruption:
      nothing is declared corrupt).
  """
  meta = read_meta(path)
  for rel, want in meta.get("files", {}).items():
    full = os.path.join(path, rel)
    try:
      got = read_retrying(functools.partial(digest.file_digest, full), full)
    except MISSING as err:
      raise CorruptCheckpointError(f"{full}: unreadable checkpoint file: {err}") from err
    why = digest.mismatch(got, want)
    if why:
      raise CorruptCheckpointError(f"{full}: checkpoint file is corrupt ({why})")
  if meta.get("table") in ("host_chunks", "host_shards"):
    table_dir = os.path.join(path, "table")
    try:
      table_shards.verify_shards(table_dir)
      stored = table_shards.stored_count(table_dir)
    except CheckpointReadError:
      raise
    except (OSError, ValueError) as err:
      raise CorruptCheckpointError(str(err)) from err
    if stored != meta.get("processes", 1):
      raise CorruptCheckpointError(f"{table_dir}: holds the shards of {stored} processes, "
                                   f"{os.path.join(path, META_FILE)} says "
                                   f"{meta.get('processes', 1)}")
  return meta


def find_resumable(root: str | None) -> str | None:
  """The newest checkpoint under `root` that passes `verify`, or None if there is none.

  Corrupt checkpoints newer than it are renamed `corrupt.step_<N>` (kept for inspection,
  never pruned) with a warning naming the bad file. Several processes: every process
  calls it with the same `root`; process 0 checks and renames, the others get its answer.

  Raises:
    CorruptCheckpointError: checkpoints exist but every one is corrupt; the message names
      each bad file and how to proceed (nothing is renamed).
  """
  if not root or jax.process_count() == 1:
    return _find_resumable_here(root)
  found, error = -1, None
  if distributed.is_main_process():
    try:
      path = _find_resumable_here(root)
      found = _step_of(path) if path else -1
    except CorruptCheckpointError as err:
      found, error = -2, err
  found = int(distributed.broadcast(np.int64(found)))
  if error is not None:
    raise error
  if found == -2:
    raise CorruptCheckpointError(f"every checkpoint under {root} is corrupt (process 0 checked "
                                 "them; its log names each bad file)")
  return os.path.join(root, step_dir_name(found)) if found >= 0 else None


def newest_good(root: str | None) -> tuple[str | None, list[tuple[str, str]]]:
  """(the newest checkpoint under `root` that passes `verify` or None, [(path, why)] of the
  corrupt ones newer than it, newest first). Reads only; nothing is renamed."""
  bad: list[tuple[str, str]] = []
  if not root:
    return None, bad
  for step in reversed(committed_steps(root)):
    path = os.path.join(root, step_dir_name(step))
    try:
      verify(path)
    except CorruptCheckpointError as err:
      bad.append((path, str(err)))
      continue
    return path, bad
  return None, bad


def _find_resumable_here(root: str | None) -> str | None:
  """`find_resumable` in this process alone."""
  if not root:
    return None
  path, bad = newest_good(root)
  if path is not None:
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


def _step_of(path: str) -> int:
  """N of a `.../step_<N>` checkpoint directory."""
  m = _STEP_DIR.match(os.path.basename(path))
  if m is None:
    raise ValueError(f"{path}: not a step_<N> checkpoint directory")
  return int(m.group(1))


def _pid_alive(pid: int) -> bool:
  """True if process `pid` exists on this host (a signal-0 probe)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # it exists, owned by another user
    return True
  return True


def removable_leftover(name: str, pid: int) -> bool:
  """Whether the entry `name` of `checkpoints/` is a leftover the process `pid` may delete.

  `tmp.step_<N>.<pid>` and `old.step_<N>.<pid>` belong to the process that made them:
  removable by that process, or by another once that pid has ended (a crashed run;
  another live run's half-written save is never touched, issue #25). The collective
  save's `tmp.step_<N>.of<P>` belongs to the run's process 0, whichever process it is.
  """
  if not name.startswith(("tmp.", "old.")):
    return False
  owner = name.rsplit(".", 1)[-1]
  if owner == str(pid) or owner.startswith("of"):
    return True
  return owner.isdigit() and not _pid_alive(int(owner))


def fsync_tree(path: str) -> None:
  """fsyncs every file and directory under `path` (orbax's files included)."""
  for dirpath, _, filenames in os.walk(path):
    for name in filenames:
      fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    fsync_directory(dirpath)

"""A host table checkpointed as per-process shards, restorable on any process count.

In a run over P processes, process p owns the host-table rows `id % P == p` (it alone
writes them back; `sfjax.train.backends.CacheBackend`). Its checkpoint of the table is
an ordinary table checkpoint (`sfjax.checkpoint.table_format`: base chunks + row deltas,
manifest with CRC-32s) of its own rows, in its own directory:

  table/                       one process (P = 1): the table checkpoint itself
    manifest.json chunk_*.npy delta_*.npy
  table/                       P > 1 processes
    process_0_of_P/            process 0's rows (id % P == 0)
    ...
    process_<P-1>_of_P/

A restore on P' processes (`load_owned`) reads every stored shard and keeps, on process
p', only the rows with `id % P' == p'`: P -> P' for any P, P' >= 1. When P' == P (and
the layout is the one written), process p' reads only its own shard, so the next
checkpoint can be a delta on top of it; on another count the loaded chunks are marked
dirty and the next checkpoint writes a base.

Every stored row is checked to belong to its shard (`id % P == p`): a shard holding a
row of another process means a mislabelled directory, and is refused naming it.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import numpy as np

from sfjax.checkpoint import table_format, table_reader
from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.embedding import host_table as host_table_lib

_CHUNK_ROWS = host_table_lib.CHUNK_ROWS
_SHARD_DIR = re.compile(r"^process_(\d+)_of_(\d+)$")


class Shard(NamedTuple):
  """One stored shard of a table checkpoint.

  Attributes:
    directory: the shard's table-checkpoint directory (holds manifest.json).
    process: the process p that wrote it.
    process_count: the process count P of the run that wrote it (`index`/`count` would
      shadow the tuple methods).
  """

  directory: str
  process: int
  process_count: int


def _shard_dir_name(index: int, count: int) -> str:
  """`process_<index>_of_<count>`: the directory of process `index`'s rows of `count`."""
  if not 0 <= index < count:
    raise ValueError(f"process index {index} is not in [0, {count})")
  return f"process_{index}_of_{count}"


def shard_directory(table_dir: str, index: int, count: int) -> str:
  """Where process `index` of `count` writes its rows of the table checkpoint `table_dir`
  (`table_dir` itself for one process)."""
  if count == 1:
    return table_dir
  return os.path.join(table_dir, _shard_dir_name(index, count))


def owned(ids: np.ndarray, index: int, count: int) -> np.ndarray:
  """bool [N]: the ids [N] process `index` of `count` owns (`id % count == index`)."""
  return np.asarray(ids) % count == index


def list_shards(table_dir: str) -> list[Shard]:
  """The shards of the table checkpoint `table_dir`, in process order.

  A directory holding `manifest.json` is the one shard of a one-process run; otherwise
  it must hold `process_<p>_of_<P>/` for every p in [0, P) and one P.

  Raises:
    ValueError: naming the directory, when it is missing, holds no shard, mixes process
      counts or lacks a process's shard.
  """
  if os.path.isfile(os.path.join(table_dir, table_format.MANIFEST_FILE)):
    return [Shard(table_dir, 0, 1)]
  try:
    names = os.listdir(table_dir)
  except OSError as err:
    raise ValueError(f"{table_dir}: unreadable table checkpoint directory: {err}") from err
  found = {}
  for name in names:
    m = _SHARD_DIR.match(name)
    if m:
      found[(int(m.group(1)), int(m.group(2)))] = os.path.join(table_dir, name)
  counts = {count for _, count in found}
  if not found:
    raise ValueError(f"{table_dir}: no {table_format.MANIFEST_FILE} and no "
                     "process_<p>_of_<P> shard directories: not a table checkpoint")
  if len(counts) != 1:
    raise ValueError(f"{table_dir}: shards of different process counts {sorted(counts)}")
  count = counts.pop()
  missing = [_shard_dir_name(p, count) for p in range(count) if (p, count) not in found]
  if missing:
    raise ValueError(f"{table_dir}: the shards {missing} of {count} processes are missing")
  return [Shard(found[(p, count)], p, count) for p in range(count)]


def verify_shards(table_dir: str) -> int:
  """Checks every shard's manifest and files (sizes, CRC-32s) without loading rows.

  Returns the number of files checked.

  Raises:
    ValueError: naming the missing shard or the first bad file.
  """
  return sum(table_reader.verify_table(s.directory) for s in list_shards(table_dir))


def stored_count(table_dir: str) -> int:
  """The process count P of the run that wrote the table checkpoint `table_dir`."""
  return list_shards(table_dir)[0].process_count


def _check_membership(shard: Shard, ids: np.ndarray, where: str) -> None:
  """Raises ValueError naming `where` if a stored row is not the shard's process's."""
  p, count = shard.process, shard.process_count
  if count > 1 and ids.size and not owned(ids, p, count).all():
    bad = int(ids[~owned(ids, p, count)][0])
    raise ValueError(f"{where}: holds row {bad}, which process {bad % count} of "
                     f"{count} owns, not process {p}: shard directories mixed up?")


class ShardedTableReader:
  """Every stored shard of a table checkpoint read as one table, chunk by chunk.

  Shards hold disjoint rows (process p's: `id % P == p`), so a chunk is the union of
  the shards' stored rows; a row found in the wrong shard is refused. Files are
  verified (size, CRC-32) as they are read (`table_reader.TableReader`).

  Args:
    table_dir: the table checkpoint (one directory or `process_<p>_of_<P>/` shards).
    shards: read only these (default: all of `list_shards(table_dir)`).

  Attributes:
    manifest: the first shard's manifest (the table spec every shard shares).
    chunks: sorted chunks holding any stored row of any shard.
  """

  def __init__(self, table_dir: str, shards: list[Shard] | None = None):
    self.shards = list_shards(table_dir) if shards is None else shards
    self._readers = [table_reader.TableReader(s.directory) for s in self.shards]
    self.manifest = self._readers[0].manifest
    for shard, reader in zip(self.shards[1:], self._readers[1:], strict=True):
      for key in ("num_rows", "width", "slot_width", "seed", "init_stddev", "chunk_rows"):
        if reader.manifest.get(key) != self.manifest.get(key):
          raise ValueError(f"{os.path.join(shard.directory, table_format.MANIFEST_FILE)}: "
                           f"{key}={reader.manifest.get(key)!r}, the first shard has "
                           f"{self.manifest.get(key)!r}")
    self.num_rows = self.manifest["num_rows"]
    self.width, self.slot_width = self.manifest["width"], self.manifest["slot_width"]
    self._stored = [set(r.chunks) for r in self._readers]
    self.chunks = tuple(sorted(set().union(*self._stored)))

  def delta_chunks(self) -> np.ndarray:
    """[K] int64 chunks that some shard's deltas change."""
    return np.unique(np.concatenate([r.delta_chunks() for r in self._readers]))

  def read(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunk `k`'s stored (values [n,E], slots [n,S], flags [n] bool) over every shard;
    rows no shard stores are 0 / False."""
    values, slots, flags = self._read_shard(0, k)  # the first shard always: it sets the shapes
    for i in range(1, len(self.shards)):
      if k in self._stored[i]:
        v, s, f = self._read_shard(i, k)
        values[f], slots[f], flags[f] = v[f], s[f], True
    return values, slots, flags

  def _read_shard(self, i: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shard i's stored chunk `k`, checked to hold only its own process's rows."""
    v, s, f = self._readers[i].read(k)
    _check_membership(self.shards[i], k * _CHUNK_ROWS + np.flatnonzero(f),
                      self.shards[i].directory)
    return v, s, f


def load_owned(table: host_table_lib.HostTable, table_dir: str, index: int,
               count: int, tracker: ChangeTracker | None = None) -> bool:
  """Restores into `table` (freshly created) the rows of `table_dir` that process `index`
  of `count` owns, from every stored shard.

  Args:
    table: the process's host table, nothing written yet.
    table_dir: the table checkpoint (one directory or `process_<p>_of_<P>/` shards).
    index: this process's index p'.
    count: this run's process count P'.
    tracker: the table's change tracker, told which restored chunks the next base
      checkpoint must rewrite (None: no checkpoints follow).

  Returns:
    True when the stored layout is this run's (P == P'): the process's own shard was
    loaded as is and may serve as the next checkpoint's delta base. False otherwise:
    the loaded chunks are marked dirty, so the next checkpoint must be a base
    (`plan_save(tracker, None)`).

  Raises:
    ValueError: a missing shard, a corrupt or incompatible file, a row stored in the
      wrong shard (each naming the directory or file), or a table already written.
  """
  if not 0 <= index < count:
    raise ValueError(f"load_owned: process index {index} is not in [0, {count})")
  shards = list_shards(table_dir)
  same_layout = shards[0].process_count == count
  if table.num_materialised:
    raise ValueError(f"load_owned: the table already holds {table.num_materialised} written "
                     "rows; restore into a freshly created table")
  reader = ShardedTableReader(table_dir, [shards[index]] if same_layout else shards)
  table_format.check_compatible(
      reader.manifest, table,
      os.path.join(reader.shards[0].directory, table_format.MANIFEST_FILE))
  loaded = []
  for k in reader.chunks:
    values, slots, flags = reader.read(k)
    local = np.flatnonzero(flags & owned(k * _CHUNK_ROWS + np.arange(flags.size), index, count))
    if local.size:  # only stored rows: a sparse table stays sparse
      table.load_rows(k * _CHUNK_ROWS + local, values[local], slots[local])
      loaded.append(k)
  # Same layout: as `table_reader.load_table` (chunks that deltas changed get rewritten
  # by the next base). Another count: every loaded chunk is new to this process's shard.
  if tracker is not None:
    tracker.mark_dirty_chunks(reader.delta_chunks() if same_layout
                              else np.array(loaded, np.int64))
  table.flush()
  return same_layout

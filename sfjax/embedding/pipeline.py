"""MixCache host pipeline: Data-Loader -> Host-Manager -> (Device-Worker) -> write-back.

ScaleFreeCTR's three roles, overlapped by bounded queues (DESIGN.md §2):

  Data-Loader thread    host batches -> VSI (np.unique) -> uniq ids + int32 vids
  Host-Manager thread   planner.plan(step, upcoming=the next batches' ids) -> wait for the
                        write-back the plan depends on (`fill_after_step`; none when the
                        next `lookahead - 1` batches are passed) -> gather fill rows +
                        optimizer slots from the host table -> pad -> device_put
                                                                   (runs `lookahead` steps ahead)
  Device-Worker         the caller: `next(pipeline)` -> jitted cache step (async dispatch)
                        -> `pipeline.submit(inputs, evicted)`
  Write-back thread     waits for step t's evicted rows, scatters them into the host
                        table, then `planner.retire(t)` (which lets later plans proceed)

An exception in any stage stops the pipeline and is re-raised in the caller with
its original traceback; `close()` stops every thread. `flush(cache)` drains the
write-backs and copies every cached row to the host table, which then holds
exactly what training produced.

Several processes (`owns`): every process runs the same planner on the same global
unique ids, so all agree on the plan; each gathers, writes back and flushes only the
rows it owns (its shard of the host table).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np

from sfjax.core import background, feature_layout
from sfjax.core.types import DeviceBatch
from sfjax.data import types
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import cache_planner, device_table, row_dtype, sharded_cache, vsi
from sfjax.embedding import host_table as host_table_lib


@dataclasses.dataclass
class _CacheStats:
  """Cumulative cache and pipeline counters (rows, bytes, seconds)."""

  row_bytes: int
  steps: int = 0
  examples: int = 0
  unique_ids: int = 0
  hits: int = 0
  misses: int = 0
  evictions: int = 0
  h2d_rows: int = 0
  ordering_waits: int = 0  # plans whose fills had to wait for an earlier step's write-back
  d2h_rows: int = 0
  loader_seconds: float = 0.0
  manager_seconds: float = 0.0
  manager_wait_seconds: float = 0.0
  writeback_seconds: float = 0.0
  device_wait_seconds: float = 0.0
  # Thread CPU seconds of the same stages (waits excluded): what they take from XLA's cores.
  loader_cpu_seconds: float = 0.0
  manager_cpu_seconds: float = 0.0  # planning, the fills' gather, staging and device_put
  writeback_cpu_seconds: float = 0.0
  swap_rows: int = 0  # rows of the fill / evict buffers moved (bucketed, >= fills; all devices)
  steps_per_swap_size: dict = dataclasses.field(default_factory=dict)  # bucket -> steps
  # "U<unique bucket>/F<swap bucket>" -> steps: each distinct pair is one compiled program.
  steps_per_shape: dict = dataclasses.field(default_factory=dict)
  put_bytes: int = 0  # bytes device_put to all devices (batches + swaps; replicas counted)

  def as_dict(self) -> dict[str, float]:
    """Counters plus derived rates (`cache_hit_rate`, `*_bytes_per_example`)."""
    d = dataclasses.asdict(self)
    ex = max(self.examples, 1)
    d["cache_hit_rate"] = self.hits / max(self.unique_ids, 1)
    d["h2d_bytes"] = self.h2d_rows * self.row_bytes
    d["d2h_bytes"] = self.d2h_rows * self.row_bytes
    d["h2d_bytes_per_example"] = d["h2d_bytes"] / ex
    d["d2h_bytes_per_example"] = d["d2h_bytes"] / ex
    return d


class StepInputs(NamedTuple):
  """What the Device-Worker needs for one step.

  Attributes:
    step: step index (0-based, the planner's step).
    batch: DeviceBatch on device; `rows` are cache slots.
    swap: CacheSwap on device.
    plan: the host CachePlan (counts for stats).
    evict_ids: [N] int64 ids of the step's evicted read-out rows, flattened in the
      read-out's order (`[F]` or `[D, Fd]`); -1 in padding entries.
  """

  step: int
  batch: DeviceBatch
  swap: cache_lib.CacheSwap
  plan: cache_planner.CachePlan
  evict_ids: np.ndarray


def _step_stats(plan: cache_planner.CachePlan, row_bytes: int) -> dict[str, int]:
  """Per-step counters of one plan: ids, hits, misses, evictions, bytes each way."""
  return {"step": plan.step, "unique_ids": plan.num_unique, "hits": plan.hits,
          "misses": plan.misses, "evictions": plan.num_evictions,
          "h2d_bytes": plan.num_fills * row_bytes, "d2h_bytes": plan.num_evictions * row_bytes}


def _flat_rows(rows: np.ndarray, count: int) -> np.ndarray:
  """[..., W] read-out rows as [count, W] (a [D, Fd, W] row-sharded read-out flattened)."""
  return rows.reshape(count, rows.shape[-1])


def _entries(mask: np.ndarray) -> slice | np.ndarray:
  """An index selecting `mask`'s True entries: a slice when they are a prefix (one shard's
  read-out: real rows first, padding after), which selects rows without copying them."""
  at = np.flatnonzero(mask)
  return slice(0, at.size) if not at.size or at[-1] == at.size - 1 else at


def device_bytes(tree) -> int:
  """Bytes a pytree of placed arrays occupies over all devices (replicas counted);
  numpy leaves count their own size."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shards = getattr(leaf, "addressable_shards", None)
    total += sum(s.data.nbytes for s in shards) if shards is not None else np.asarray(leaf).nbytes
  return int(total)


class CachePipeline(Iterator[StepInputs]):
  """Overlapped host stages feeding a cache-backed train step.

  Args:
    batches: host batches (per-field ids), e.g. `dataset.train_batches(B, seed)`.
    field_offsets: [F] field starts in the concatenated table.
    host_table: the full table (RAM or mmap).
    planner: the cache planner (its `lookahead` bounds how far planning runs ahead).
    put_batch: host DeviceBatch -> device DeviceBatch (e.g. `jax.device_put` with shardings).
    put_swap: host CacheSwap -> device CacheSwap.
    loader_depth: batches the Data-Loader keeps ready.
    layout: where the planner's slots live (`sharded_cache.SlotLayout`); default one
      cache of `planner.num_slots` rows (maybe replicated on every device).
    sharded_swap: stage swaps per owning device (`[D, Fd]` buffers, row-sharded cache);
      False: one `[F]` swap (needs `layout.num_shards == 1`).
    owner_blocks: lay each step's unique rows out in per-owner blocks of local slots
      (`sharded_cache.block_by_owner`, for the row-sharded step) instead of `[U]` slots.
    bucket_unique: False pads every step's unique rows to the full unique capacity
      (a benchmark's exchange volume without VSI when the capacity is B*F); with
      owner_blocks, to blocks of at least capacity / D rows.
    owns: ids [N] -> bool [N], the ids whose host rows this process owns (several
      processes: each holds a shard of the host table by id). Only owned rows are
      gathered for fills (the others are staged as zeros, so the fills of all processes
      sum to the whole fill), written back and flushed. None: every id (one process).
    table_starts: [T] first row of each table when the row optimizer differs per table:
      each DeviceBatch then carries the `row_tables` of its rows (same order, same
      blocks); None: it does not.
    nice: niceness (0-19, Linux) of the loader, manager and write-back threads, so that
      on a CPU they yield the cores to XLA's step threads, or `background.IDLE`
      (SCHED_IDLE); 0: as created.
    keep_upcoming: how many of the next batches the Host-Manager reads before planning a
      step, passing their unique ids to `planner.plan(upcoming=)` so that their cached
      rows are not evicted. `lookahead - 1` (the default, None) means a plan never waits
      for a write-back while the cache has room to keep them: each such wait stalls the
      device for a write-back, a gather and a transfer. 0: the policy alone.

  Each step's unique rows are padded to the smallest bucket of `cache_lib.swap_buckets(unique
  capacity)` that holds them, so gathers and the row-gradient all-reduce run over
  the real unique rows, not the padded capacity.
  """

  def __init__(self, batches: Iterable[types.Batch], *, field_offsets: np.ndarray,
               column_rows: np.ndarray | None = None,
               host_table: host_table_lib.HostTable, planner: cache_planner.CachePlanner,
               put_batch: Callable[[Any], Any], put_swap: Callable[[Any], Any],
               loader_depth: int = 4, layout: sharded_cache.SlotLayout | None = None,
               sharded_swap: bool = False, owner_blocks: bool = False,
               bucket_unique: bool = True,
               owns: Callable[[np.ndarray], np.ndarray] | None = None,
               table_starts: np.ndarray | None = None, nice: int = 0,
               keep_upcoming: int | None = None):
    self.layout = layout or sharded_cache.SlotLayout(1, planner.num_slots)
    if self.layout.num_slots != planner.num_slots:
      raise ValueError(f"CachePipeline: layout holds {self.layout.num_slots} slots, the planner "
                       f"{planner.num_slots}")
    if not sharded_swap and self.layout.num_shards != 1:
      raise ValueError("CachePipeline: a layout over several shards needs sharded_swap=True")
    self._sharded_swap, self._owner_blocks = sharded_swap, owner_blocks
    self._bucket_unique = bucket_unique
    self._owns = owns
    self.unique_buckets = (cache_lib.swap_buckets(planner.unique_capacity) if bucket_unique
                           else (planner.unique_capacity,))
    # Per-owner blocks and per-device swaps hold about 1/D of the rows: finer buckets.
    self.block_buckets = cache_lib.owner_buckets(planner.unique_capacity,
                                                 self.layout.num_shards)
    self.host_table, self.planner = host_table, planner
    self._offsets = np.asarray(field_offsets, np.int64)
    self._column_rows = column_rows
    self._table_starts = table_starts
    self._put_batch, self._put_swap = put_batch, put_swap
    self.buckets = (cache_lib.owner_buckets(planner.fill_capacity, self.layout.num_shards)
                    if sharded_swap else cache_lib.swap_buckets(planner.fill_capacity))
    # A row moves its values (the table's dtype: 2 bytes when half-width) and float32 slots.
    self.stats = _CacheStats(row_bytes=host_table.dtype.itemsize * host_table.width
                             + 4 * host_table.slot_width)
    self._stats_lock = threading.Lock()
    self._stop = threading.Event()
    self._writer_error: BaseException | None = None
    self._writeback: queue.Queue = queue.Queue()
    self._submitted = 0
    self._flushed_after = -1  # `_submitted` at the last flush: nothing new to write if equal
    self.last_step: dict[str, int] = {}  # counters of the most recently submitted step
    # Which id each (physical) cache slot holds ON THE DEVICE, i.e. after the last submitted step.
    # The planner runs up to `lookahead` steps ahead, so its own slot map may already
    # include swaps the device has not executed; flushing must follow the device.
    self._device_slot_ids = np.full((planner.num_slots,), -1, np.int64)
    self._nice = nice
    self.keep_upcoming = planner.lookahead - 1 if keep_upcoming is None else int(keep_upcoming)
    if self.keep_upcoming < 0:
      raise ValueError(f"CachePipeline: keep_upcoming must be >= 0, got {keep_upcoming}")
    self._loader = background.map_in_background(self._load, batches, maxsize=loader_depth,
                                              name="sfjax-data-loader", nice=nice)
    self._manager = background.BackgroundIterator(self._manage(), maxsize=planner.lookahead,
                                                name="sfjax-host-manager", nice=nice)
    self._writer = threading.Thread(target=self._write_back_loop, name="sfjax-write-back",
                                    daemon=True)
    self._writer.start()

  # ---- Data-Loader ----------------------------------------------------------
  def _load(self, batch: types.Batch) -> tuple[types.Batch, vsi.VirtualIds]:
    t, cpu = time.perf_counter(), time.thread_time()
    ids = vsi.global_row_ids(batch.ids, self._offsets, self.host_table.num_rows,
                             column_rows=self._column_rows,
                             allow_padding=batch.weights is not None)
    virt = vsi.dedup_ids(ids, self.planner.unique_capacity, pad_id=-1,
                         num_rows=self.host_table.num_rows)
    with self._stats_lock:
      self.stats.loader_seconds += time.perf_counter() - t
      self.stats.loader_cpu_seconds += time.thread_time() - cpu
    return batch, virt

  # ---- Host-Manager ---------------------------------------------------------
  def _wait_retired(self, step: int) -> None:
    """Blocks until `step` has retired (no-op for step < 0); aborts on stop or writer error."""
    t = time.perf_counter()
    while step >= 0 and not self.planner.wait_retired(step, timeout=0.05):
      if self._writer_error is not None:
        raise RuntimeError("write-back stage failed") from self._writer_error
      if self._stop.is_set():
        raise RuntimeError("pipeline closed")
    with self._stats_lock:
      self.stats.manager_wait_seconds += time.perf_counter() - t

  def _device_rows(self, plan: cache_planner.CachePlan, virt: vsi.VirtualIds):
    """(rows, vids, row_tables) of the step's unique ids for the device: physical slots
    padded to a unique bucket, or per-owner blocks of local slots (`owner_blocks`).
    Padding ids (bags, sequences) point at the padding entry U, which the bucket then
    includes. `row_tables` (None without `table_starts`) follows the rows' order."""
    vids = virt.vids
    starts = self._table_starts
    if not self._owner_blocks:
      unique = cache_lib.bucket_for(plan.num_unique + int(virt.has_padding), self.unique_buckets)
      tables = None if starts is None else feature_layout.row_tables(starts, virt.uniq[:unique])
      return self.layout.physical(plan.slots[:unique]), vids, tables
    shards = self.layout.num_shards
    min_rows = 0 if self._bucket_unique else -(-self.planner.unique_capacity // shards)
    slots = self.layout.physical(plan.slots[:plan.num_unique])
    rows, vids = sharded_cache.block_by_owner(slots, vids, self.layout, self.block_buckets,
                                              min_rows=min_rows, has_padding=virt.has_padding)
    if starts is None:
      return rows, vids, None
    tables = feature_layout.row_tables(starts, virt.uniq[:plan.num_unique])
    return rows, vids, sharded_cache.blocked_like(slots, tables, self.layout,
                                                  rows.shape[0] // shards)

  def _with_upcoming(self) -> Iterator[tuple[types.Batch, vsi.VirtualIds, np.ndarray | None]]:
    """The loader's (batch, virt), each with the unique ids of the next `keep_upcoming`
    batches (read ahead from the loader; None when none is asked for or left)."""
    window: collections.deque = collections.deque()
    # `keep_upcoming` Nones after the last batch let the window drain through one loop.
    for item in itertools.chain(self._loader, itertools.repeat(None, self.keep_upcoming)):
      window.append(item)
      if len(window) > self.keep_upcoming:
        (batch, virt), *later = window
        ids = [v.uniq[:v.num_unique] for _, v in filter(None, later)]
        # One batch ahead (lookahead 2, the default): its ids as they are, no copy.
        yield batch, virt, (ids[0] if len(ids) == 1 else np.concatenate(ids) if ids else None)
        window.popleft()

  def _manage(self) -> Iterator[StepInputs]:
    for step, (batch, virt, upcoming) in enumerate(self._with_upcoming()):
      # At most `lookahead` planned-but-unretired steps, this one included.
      self._wait_retired(step - self.planner.lookahead)
      t, cpu = time.perf_counter(), time.thread_time()
      plan = self.planner.plan(step, virt.uniq[:virt.num_unique], upcoming=upcoming)
      self._wait_retired(plan.fill_after_step)  # the write-back ordering rule
      values, opt_slots = self._gather_owned(plan.fill_ids[:plan.num_fills])
      staged = sharded_cache.stage_swap(plan, values, opt_slots, self.layout, self.buckets)
      swap = staged.swap
      if not self._sharded_swap:
        swap = cache_lib.CacheSwap(*(x[0] for x in swap))
      size = staged.swap.fill_slots.shape[1]
      rows, vids, row_tables = self._device_rows(plan, virt)
      unique = rows.shape[0]
      db = DeviceBatch(rows, vids, batch.dense, batch.labels, batch.mask, batch.weights,
                       row_tables)
      db, swap = self._put_batch(db), self._put_swap(swap)
      put_bytes = device_bytes((db, swap))
      inputs = StepInputs(step, db, swap, plan, staged.evict_ids)
      with self._stats_lock:
        s = self.stats
        s.manager_seconds += time.perf_counter() - t
        s.manager_cpu_seconds += time.thread_time() - cpu
        s.steps += 1
        s.examples += int(batch.mask.sum())
        s.unique_ids += plan.num_unique
        s.hits += plan.hits
        s.misses += plan.misses
        s.evictions += plan.num_evictions
        s.h2d_rows += plan.num_fills
        s.d2h_rows += plan.num_evictions
        s.ordering_waits += int(plan.fill_after_step >= 0)
        s.swap_rows += size * self.layout.num_shards
        s.steps_per_swap_size[size] = s.steps_per_swap_size.get(size, 0) + 1
        shape = f"U{unique}/F{size}"
        s.steps_per_shape[shape] = s.steps_per_shape.get(shape, 0) + 1
        s.put_bytes += put_bytes
      yield inputs

  def _owned(self, ids: np.ndarray) -> np.ndarray:
    """bool [N]: the ids whose host rows this process owns (all with one process)."""
    ids = np.asarray(ids)
    return np.ones(ids.shape, bool) if self._owns is None else np.asarray(self._owns(ids), bool)

  def _gather_owned(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host rows of `ids` [N]: the owned ones from the host table, zeros for the others."""
    if self._owns is None:
      return self.host_table.gather(ids)
    mine = self._owned(ids)
    values = np.zeros((ids.size, self.host_table.width), self.host_table.dtype)
    slots = np.zeros((ids.size, self.host_table.slot_width), np.float32)
    values[mine], slots[mine] = self.host_table.gather(ids[mine])
    return values, slots

  def __next__(self) -> StepInputs:
    self._raise_writer_error()
    t = time.perf_counter()
    try:
      inputs = next(self._manager)
    except BaseException:
      self._raise_writer_error()
      raise
    with self._stats_lock:
      self.stats.device_wait_seconds += time.perf_counter() - t
    return inputs

  # ---- write-back -----------------------------------------------------------
  def submit(self, inputs: StepInputs, evicted: device_table.TableState) -> None:
    """Hands step `inputs.step`'s evicted rows (device arrays, maybe not ready) to the writer."""
    self._raise_writer_error()
    plan = inputs.plan
    fill_slots = self.layout.physical(plan.fill_slots[:plan.num_fills])
    self._device_slot_ids[fill_slots] = plan.fill_ids[:plan.num_fills]
    self.last_step = _step_stats(plan, self.stats.row_bytes)
    self._submitted += 1
    self._writeback.put((plan, inputs.evict_ids, evicted))

  def _write_back_loop(self) -> None:
    if self._nice:
      background.lower_thread_priority(self._nice)
    while True:
      item = self._writeback.get()
      if item is None:
        return
      plan, evict_ids, evicted = item
      try:
        t, cpu = time.perf_counter(), time.thread_time()
        if plan.num_evictions:
          real = _entries((evict_ids >= 0) & self._owned(evict_ids))  # rows this process owns
          # Waits for the device step. Row-sharded: each row is read from its owner's shard.
          values, opt_slots = (_flat_rows(np.asarray(x), evict_ids.size)[real] for x in evicted)
          values = row_dtype.from_storage(values, self.host_table.dtype)  # bfloat16 bits
          self.host_table.scatter(evict_ids[real], values, opt_slots)
        self.planner.retire(plan.step)
        with self._stats_lock:
          self.stats.writeback_seconds += time.perf_counter() - t
          self.stats.writeback_cpu_seconds += time.thread_time() - cpu
      except BaseException as exc:  # pylint: disable=broad-except
        self._writer_error = exc
        self._stop.set()
        return
      finally:
        self._writeback.task_done()

  def _raise_writer_error(self) -> None:
    if self._writer_error is not None:
      exc = self._writer_error
      raise exc.with_traceback(exc.__traceback__)

  def drain(self) -> None:
    """Waits until every submitted step's write-back has landed (or the writer failed)."""
    while self._writeback.unfinished_tasks and self._writer_error is None:
      time.sleep(0.001)
    self._raise_writer_error()

  def flush(self, cache: device_table.TableState) -> int:
    """Writes every cached row (values and optimizer slots) to the host table.

    Call with the latest cache state after its step was submitted; the cache keeps its
    rows, so training may continue. Steps already planned but not yet run are ignored
    (their swaps have not happened on the device). A second flush with no step submitted
    in between writes nothing (the cache cannot have changed). Returns the number of rows
    written.
    """
    self.drain()
    if self._flushed_after == self._submitted:
      return 0
    self._flushed_after = self._submitted
    held = self._device_slot_ids >= 0
    slots = np.flatnonzero(held & self._owned(self._device_slot_ids))
    ids = self._device_slot_ids[slots]
    if ids.size:
      values = row_dtype.from_storage(np.asarray(cache.values)[slots], self.host_table.dtype)
      opt_slots = np.asarray(cache.opt_slots)[slots]
      self.host_table.scatter(ids, values, opt_slots)
    self.host_table.flush()
    return int(ids.size)

  def close(self) -> None:
    """Stops every stage; pending write-backs already queued are completed first."""
    self._stop.set()
    self._manager.close()
    self._loader.close()
    self._writeback.put(None)
    self._writer.join(timeout=30.0)

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

"""MixCache host pipeline: Data-Loader -> Host-Manager -> (Device-Worker) -> write-back.

ScaleFreeCTR's three roles, overlapped by bounded queues (DESIGN.md §2):

  Data-Loader thread    host batches -> VSI (np.unique) -> uniq ids + int32 vids
  Host-Manager thread   planner.plan(step) -> wait for the write-back the plan depends on
                        (`fill_after_step`) -> gather fill rows + optimizer slots from the
                        host table -> pad -> device_put            (runs `lookahead` steps ahead)
  Device-Worker         the caller: `next(pipeline)` -> jitted cache step (async dispatch)
                        -> `pipeline.submit(inputs, evicted)`
  Write-back thread     waits for step t's evicted rows, scatters them into the host
                        table, then `planner.retire(t)` (which lets later plans proceed)

An exception in any stage stops the pipeline and is re-raised in the caller with
its original traceback; `close()` stops every thread. `flush(cache)` drains the
write-backs and copies every cached row to the host table, which then holds
exactly what training produced.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

from sfjax.core import background
from sfjax.core.types import DeviceBatch
from sfjax.data import types
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import cache_planner
from sfjax.embedding import device_table
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding import vsi


@dataclasses.dataclass
class CacheStats:
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
  swap_rows: int = 0  # rows of the fill / evict buffers moved (bucketed, >= fills)
  steps_per_swap_size: dict = dataclasses.field(default_factory=dict)  # bucket -> steps

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
    plan: the host CachePlan (evict ids for the write-back, counts for stats).
  """

  step: int
  batch: DeviceBatch
  swap: cache_lib.CacheSwap
  plan: cache_planner.CachePlan


def step_stats(plan: cache_planner.CachePlan, row_bytes: int) -> dict[str, int]:
  """Per-step counters of one plan: ids, hits, misses, evictions, bytes each way."""
  return {"step": plan.step, "unique_ids": plan.num_unique, "hits": plan.hits,
          "misses": plan.misses, "evictions": plan.num_evictions,
          "h2d_bytes": plan.num_fills * row_bytes, "d2h_bytes": plan.num_evictions * row_bytes}


def swap_buckets(capacity: int, eighths: int = 8, halvings: int = 2,
                 multiple: int = 256) -> tuple[int, ...]:
  """The few swap lengths a cache step is compiled for.

  Fill and evict buffers are sized by the step's real misses (the smallest bucket that
  holds them), not padded to the unique capacity every step: at a 45% hit rate a step
  moves about half of the padded rows. Buckets are `k/8` of the capacity (k = 1..8,
  so a step pads by at most an eighth of the capacity) plus `1/16`, `1/32`, ... for
  nearly-all-hit steps, rounded up to a multiple of `multiple`. Each bucket compiles
  once (at most `eighths + halvings` programs), so steps never recompile after warm-up.
  """
  fractions = [(k, eighths) for k in range(1, eighths + 1)]
  fractions += [(1, eighths << h) for h in range(1, halvings + 1)]
  sizes = {capacity}
  for num, den in fractions:
    size = -(-capacity * num // den)  # ceil: never 0
    sizes.add(min(capacity, -(-size // multiple) * multiple))
  return tuple(sorted(sizes))


def bucket_for(count: int, buckets: tuple[int, ...]) -> int:
  """The smallest bucket >= `count` (buckets sorted ascending; the last is the capacity)."""
  return buckets[min(int(np.searchsorted(buckets, count)), len(buckets) - 1)]


def _pad_rows(rows: np.ndarray, length: int) -> np.ndarray:
  out = np.zeros((length, rows.shape[1]), np.float32)
  out[:rows.shape[0]] = rows
  return out


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
  """

  def __init__(self, batches: Iterable[types.Batch], *, field_offsets: np.ndarray,
               host_table: host_table_lib.HostTable, planner: cache_planner.CachePlanner,
               put_batch: Callable[[Any], Any], put_swap: Callable[[Any], Any],
               loader_depth: int = 4):
    self.host_table, self.planner = host_table, planner
    self._offsets = np.asarray(field_offsets, np.int64)
    self._put_batch, self._put_swap = put_batch, put_swap
    self.buckets = swap_buckets(planner.fill_capacity)
    self.stats = CacheStats(row_bytes=4 * (host_table.width + host_table.slot_width))
    self._stats_lock = threading.Lock()
    self._stop = threading.Event()
    self._writer_error: BaseException | None = None
    self._writeback: queue.Queue = queue.Queue()
    self._submitted = 0
    self._flushed_after = -1  # `_submitted` at the last flush: nothing new to write if equal
    self.last_step: dict[str, int] = {}  # counters of the most recently submitted step
    # Which id each cache slot holds ON THE DEVICE, i.e. after the last submitted step.
    # The planner runs up to `lookahead` steps ahead, so its own slot map may already
    # include swaps the device has not executed; flushing must follow the device.
    self._device_slot_ids = np.full((planner.num_slots,), -1, np.int64)
    self._loader = background.map_in_background(self._load, batches, maxsize=loader_depth,
                                              name="sfjax-data-loader")
    self._manager = background.BackgroundIterator(self._manage(), maxsize=planner.lookahead,
                                                name="sfjax-host-manager")
    self._writer = threading.Thread(target=self._write_back_loop, name="sfjax-write-back",
                                    daemon=True)
    self._writer.start()

  # ---- Data-Loader ----------------------------------------------------------
  def _load(self, batch: types.Batch) -> tuple[types.Batch, vsi.VirtualIds]:
    t = time.perf_counter()
    ids = vsi.global_row_ids(batch.ids, self._offsets)
    virt = vsi.dedup_ids(ids, self.planner.unique_capacity, pad_id=-1)
    with self._stats_lock:
      self.stats.loader_seconds += time.perf_counter() - t
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

  def _manage(self) -> Iterator[StepInputs]:
    for step, (batch, virt) in enumerate(self._loader):
      # At most `lookahead` planned-but-unretired steps, this one included.
      self._wait_retired(step - self.planner.lookahead)
      t = time.perf_counter()
      plan = self.planner.plan(step, virt.uniq[:virt.num_unique])
      self._wait_retired(plan.fill_after_step)  # the write-back ordering rule
      values, opt_slots = self.host_table.gather(plan.fill_ids[:plan.num_fills])
      size = bucket_for(max(plan.num_fills, plan.num_evictions), self.buckets)
      swap = cache_lib.CacheSwap(plan.fill_slots[:size], _pad_rows(values, size),
                                 _pad_rows(opt_slots, size), plan.evict_slots[:size])
      db = DeviceBatch(plan.slots, virt.vids, batch.dense, batch.labels, batch.mask)
      inputs = StepInputs(step, self._put_batch(db), self._put_swap(swap), plan)
      with self._stats_lock:
        s = self.stats
        s.manager_seconds += time.perf_counter() - t
        s.steps += 1
        s.examples += int(batch.mask.sum())
        s.unique_ids += plan.num_unique
        s.hits += plan.hits
        s.misses += plan.misses
        s.evictions += plan.num_evictions
        s.h2d_rows += plan.num_fills
        s.d2h_rows += plan.num_evictions
        s.ordering_waits += int(plan.fill_after_step >= 0)
        s.swap_rows += size
        s.steps_per_swap_size[size] = s.steps_per_swap_size.get(size, 0) + 1
      yield inputs

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
    self._device_slot_ids[plan.fill_slots[:plan.num_fills]] = plan.fill_ids[:plan.num_fills]
    self.last_step = step_stats(plan, self.stats.row_bytes)
    self._submitted += 1
    self._writeback.put((plan, evicted))

  def _write_back_loop(self) -> None:
    while True:
      item = self._writeback.get()
      if item is None:
        return
      plan, evicted = item
      try:
        t = time.perf_counter()
        n = plan.num_evictions
        if n:
          values = np.asarray(evicted.values)[:n]  # waits for the device step
          opt_slots = np.asarray(evicted.opt_slots)[:n]
          self.host_table.scatter(plan.evict_ids[:n], values, opt_slots)
        self.planner.retire(plan.step)
        with self._stats_lock:
          self.stats.writeback_seconds += time.perf_counter() - t
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
    slots = np.flatnonzero(self._device_slot_ids >= 0)
    ids = self._device_slot_ids[slots]
    if ids.size:
      values = np.asarray(cache.values)[slots]
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

"""sfjax.embedding: huge embedding tables, the device cache in front of them, row optimizers.

  HostTable                        the whole table on the host (numpy, or memory-mapped; a
                                   table of a smaller dim stored at its own width, `packed_rows`)
  TableInits / init_table_rows     per-table initial rows of the concatenated table
  TableState / init_table          a table (and its optimizer slots) on the device
  prepare_batch                    VSI: a batch's unique rows and virtual ids (IdRangeError
                                   for an id outside its field's rows)
  CachePlanner / CachePipeline     the MixCache: host planner and the overlapped stages
  RowOptimizer / ROW_OPTIMIZERS    optax-style optimizers over touched rows only
  ROW_DTYPES                       the rows' storage dtype by name (`embedding.dtype`: float32, or
                                   half-width bfloat16 / float16)
  apply_row_grads / pull_rows      a host parameter server: rows pulled per id, updated on the
                                   host in numpy (`host_ps`, SFCTR's baseline)

Modules: `host_table` (+ `host_table_spec`, `host_table_files`, `host_rows`, `packed_rows`), `device_table`, `vsi`, `cache` (the device
cache state), `cache_planner` (+ `slot_index`), `pipeline`, `sharded_cache` (row-sharded
over devices), `row_optimizers`, `row_dtype`, `host_ps`, `initializers` and `belady` (the offline optimum).
"""

from sfjax.embedding.belady import simulate_belady
from sfjax.embedding.cache import (
  CacheSwap,
  bucket_for,
  init_cache,
  owner_buckets,
  swap_buckets,
  swap_rows,
)
from sfjax.embedding.cache_planner import CACHE_POLICIES, CacheCapacityError, CachePlanner
from sfjax.embedding.device_table import TableState, gather_rows, init_table, scatter_rows
from sfjax.embedding.host_ps import (
  HostRowOptimizer,
  aggregate_row_grads,
  apply_row_grads,
  host_row_optimizer_from_config,
  pull_rows,
)
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable
from sfjax.embedding.host_table_spec import HostTableSpec
from sfjax.embedding.initializers import TableInits, init_table_rows
from sfjax.embedding.pipeline import CachePipeline, device_bytes
from sfjax.embedding.row_dtype import ROW_DTYPE_NAMES, ROW_DTYPES
from sfjax.embedding.row_optimizers import (
  ROW_OPTIMIZER_NAMES,
  ROW_OPTIMIZERS,
  RowOptimizer,
  row_optimizer_from_config,
)
from sfjax.embedding.vsi import IdRangeError, dedup_ids, global_row_ids, prepare_batch

__all__ = [
  "CACHE_POLICIES",
  "CHUNK_ROWS",
  "ROW_DTYPES",
  "ROW_DTYPE_NAMES",
  "ROW_OPTIMIZERS",
  "ROW_OPTIMIZER_NAMES",
  "CacheCapacityError",
  "CachePipeline",
  "CachePlanner",
  "CacheSwap",
  "HostRowOptimizer",
  "HostTable",
  "HostTableSpec",
  "IdRangeError",
  "RowOptimizer",
  "TableInits",
  "TableState",
  "aggregate_row_grads",
  "apply_row_grads",
  "bucket_for",
  "dedup_ids",
  "device_bytes",
  "gather_rows",
  "global_row_ids",
  "host_row_optimizer_from_config",
  "init_cache",
  "init_table",
  "init_table_rows",
  "owner_buckets",
  "prepare_batch",
  "pull_rows",
  "row_optimizer_from_config",
  "scatter_rows",
  "simulate_belady",
  "swap_buckets",
  "swap_rows",
]

"""A lazily initialised bundle table: its written rows on disk, every other row from its rule.

A cache-backend run's host table initialises a row on first read from `(seed, row)`
(`sfjax.embedding.initializers.init_rows`; a feature layout's tables each with their
own stddev), so a 10^9-row table that training touched 10^6 times holds 10^6 rows. Its
bundle stores just those (issue #23 item 3):

  table/written_ids.npy     int64 [M] the written rows, sorted
  table/written_<i>.npy     rows [M_i, E] of written positions [i, i + M_i) (float32,
                            float16, or int8 with `table/written_scales_<i>.npy` [M_i])

and the manifest's table entry says how every other row is computed:

  {"storage": "lazy", "rows": V, "dim": E, "dtype", "chunk_rows" (written rows per file),
   "written": {"rows": M, "ids": "table/written_ids.npy"},
   "chunks": [{"written": [i, i + M_i], "values", "scales"?}],
   "init": {"rule": "init_rows", "seed", "stddev", "tables"?: {"starts", "stddevs"}}}

An unwritten row r is `init_rows(seed, 0, [r], E, stddev)` (with `tables`: the stddev of
the table t with starts[t] <= r < starts[t + 1]), in float32, bit for bit what the
trainer's `HostTable.gather` returns for it; written rows are stored in the bundle's
dtype. `LazyRows` reads them: nothing [V]-sized is ever allocated (memory: the M ids
and, unless memory-mapped, the M written rows).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import numpy as np

from sfjax.core.feature_layout import row_tables
from sfjax.embedding.initializers import init_rows
from sfjax.embedding.row_dtype import row_dtype
from sfjax.serving.row_source import decode_rows, quantize_int8

STORAGE = "lazy"  # the manifest table entry's "storage" of such a table
IDS_FILE = "table/written_ids.npy"
WRITTEN_PER_FILE = 1 << 16  # written rows per values file


def init_rule(table_manifest: Mapping[str, Any], where: str) -> dict[str, Any]:
  """The bundle's `init` entry from a host-table checkpoint's manifest (seed, init_stddev,
  per-table stddevs when recorded).

  Raises:
    ValueError: naming `where` when the manifest lacks the seed or stddev.
  """
  try:
    rule: dict[str, Any] = {"rule": "init_rows", "seed": int(table_manifest["seed"]),
                            "stddev": float(table_manifest["init_stddev"])}
    if table_manifest.get("dtype", "float32") != "float32":  # half-width training rows
      rule["row_dtype"] = str(table_manifest["dtype"])
    tables = table_manifest.get("tables")
    if tables is not None:
      rule["tables"] = {"starts": [int(s) for s in tables["starts"]],
                        "stddevs": [float(s) for s in tables["stddevs"]]}
  except (KeyError, TypeError, ValueError) as err:
    raise ValueError(f"{where}: the table manifest does not give the initial-row rule "
                     f"(seed, init_stddev, tables): {err}") from err
  return rule


def initial_rows(rule: Mapping[str, Any], rows: np.ndarray, width: int) -> np.ndarray:
  """float32 [n, E] initial values of rows `rows [n]` (int64, >= 0) under `rule`; rounded
  to the training rows' dtype (`row_dtype`, half-width runs) as the trainer's table was."""
  rows = np.asarray(rows, np.int64)
  tables = rule.get("tables")
  if tables is None:
    values = init_rows(int(rule["seed"]), 0, rows, width, float(rule["stddev"]))
  else:  # as `init_table_rows`: each row gets its table's stddev (float64), the same values
    stddevs = np.asarray(tables["stddevs"], np.float64)[row_tables(tables["starts"], rows)]
    values = init_rows(int(rule["seed"]), 0, rows, width, stddevs)
  if "row_dtype" in rule:
    values = values.astype(row_dtype(rule["row_dtype"], "bundle init.row_dtype"))
    values = values.astype(np.float32)
  return values


def written_rows(reader, chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(ids [m] int64 ascending, values [m, E] float32) of each stored chunk's written rows.

  Args:
    reader: a host-table checkpoint reader (`sfjax.checkpoint.table_shards.ShardedTableReader`:
      `chunks`, the stored chunk indices, and `read(k) -> (values, slots, flags)`).
    chunk_rows: rows per checkpoint chunk.
  """
  for k in reader.chunks:
    values, _, flags = reader.read(k)
    local = np.flatnonzero(flags)
    if local.size:
      yield k * chunk_rows + local.astype(np.int64), values[local]


def count_stored_rows(reader) -> int:
  """M, the rows `reader` (as for `written_rows`) stores as written."""
  return sum(int(np.count_nonzero(reader.read(k)[2])) for k in reader.chunks)


def write_lazy_table(out: str, written: Iterable[tuple[np.ndarray, np.ndarray]], num_rows: int,
                     width: int, dtype: str, rule: Mapping[str, Any]) -> dict[str, Any]:
  """Writes `written` (ids ascending across blocks, values [m, E]) under `out/table`; the
  manifest's table entry (module docstring)."""
  os.makedirs(os.path.join(out, "table"))
  ids_parts: list[np.ndarray] = []
  pending: list[np.ndarray] = []
  entries: list[dict[str, Any]] = []
  count = 0

  def flush(block: np.ndarray) -> None:
    lo = entries[-1]["written"][1] if entries else 0  # the first written position it holds
    entry: dict[str, Any] = {"written": [lo, lo + int(block.shape[0])],
                             "values": f"table/written_{lo:012d}.npy"}
    values, scales = block, None
    if dtype == "int8":
      values, scales = quantize_int8(block)
      entry["scales"] = f"table/written_scales_{lo:012d}.npy"
      np.save(os.path.join(out, entry["scales"]), scales)
    np.save(os.path.join(out, entry["values"]), np.ascontiguousarray(values.astype(dtype)))
    entries.append(entry)

  for ids, values in written:
    ids = np.asarray(ids, np.int64)
    if ids.size and ((ids_parts and ids[0] <= ids_parts[-1][-1]) or np.any(np.diff(ids) <= 0)
                     or ids[0] < 0 or ids[-1] >= num_rows):
      raise ValueError(f"{out}: written row ids must ascend within [0, {num_rows})")
    if ids.size:
      ids_parts.append(ids)
      pending.append(np.asarray(values, np.float32).reshape(ids.size, width))
      count += ids.size
    while sum(p.shape[0] for p in pending) >= WRITTEN_PER_FILE:
      block = np.concatenate(pending)
      flush(block[:WRITTEN_PER_FILE])
      pending = [block[WRITTEN_PER_FILE:]]
  if pending and sum(p.shape[0] for p in pending):
    flush(np.concatenate(pending))
  all_ids = np.concatenate(ids_parts) if ids_parts else np.zeros((0,), np.int64)
  np.save(os.path.join(out, IDS_FILE), all_ids)
  return {"name": "table", "storage": STORAGE, "rows": int(num_rows), "dim": int(width),
          "dtype": dtype, "chunk_rows": WRITTEN_PER_FILE,
          "written": {"rows": count, "ids": IDS_FILE}, "chunks": entries, "init": dict(rule)}


class LazyRows:
  """`RowSource` of a lazy bundle table: written rows from disk, the others from the rule.

  Args:
    path: the bundle directory.
    table: the manifest's lazy table entry.
    mmap: memory-map the written rows (RAM: the pages read) instead of decoding them all
      to float32 in RAM (M * E * 4 bytes).
  """

  def __init__(self, path: str, table: Mapping[str, Any], mmap: bool = True):
    self.num_rows, self.width = int(table["rows"]), int(table["dim"])
    self.per_file, self.rule = int(table["chunk_rows"]), dict(table["init"])
    mode: Literal["r"] | None = "r" if mmap else None
    self.ids = np.load(os.path.join(path, table["written"]["ids"]), mmap_mode=mode)  # [M]
    self.num_written = int(self.ids.shape[0])
    self.chunks = []
    for c in table["chunks"]:
      values = np.load(os.path.join(path, c["values"]), mmap_mode=mode)
      scales = np.load(os.path.join(path, c["scales"]), mmap_mode=mode) if c.get("scales") else None
      if not mmap:  # decoded once
        values, scales = decode_rows(values, scales), None
      self.chunks.append((values, scales))

  def gather(self, rows: np.ndarray) -> np.ndarray:
    """rows [n] int64 (-1: padding, a zero row) -> float32 [n, E]: written rows as stored,
    the others `initial_rows`."""
    rows = np.asarray(rows, np.int64)
    out = np.zeros((rows.shape[0], self.width), np.float32)
    real = np.flatnonzero(rows >= 0)
    if not real.size:
      return out
    wanted = rows[real]
    pos = np.searchsorted(self.ids, wanted)
    found = pos < self.num_written
    found[found] = np.asarray(self.ids[pos[found]]) == wanted[found]
    fresh = real[~found]
    if fresh.size:
      out[fresh] = initial_rows(self.rule, rows[fresh], self.width)
    stored, at = real[found], pos[found]
    file_of = at // self.per_file
    for k in np.unique(file_of).tolist():
      sel = file_of == k
      values, scales = self.chunks[k]
      local = at[sel] - k * self.per_file
      out[stored[sel]] = decode_rows(values[local], None if scales is None else scales[local])
    return out

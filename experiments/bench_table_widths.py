"""Host-table rows at each table's own width against rows at the model's width (issue #22).

  python -m experiments.bench_table_widths [--config=experiments/configs/bench_table_widths.py[:smoke]]

A table whose embedding dim d is below the model's D is read through its rows' first d
latent columns; the others start at 0 and stay 0, so the host table stores only the
kept columns (`sfjax.embedding.packed_rows`). For `full` (every table stored at the
model's width: the same rows, dims not recorded) and `packed` (dims recorded), each in
turn on a fresh in-RAM host table:

  1. every row is written once, in blocks, with the initial rows of the tables' dims
     (`initializers.init_table_rows`: 0 past a dim, in both tables): the table's `nbytes`
     and the growth of this process's resident memory (VmRSS) it caused;
  2. `steps` timed steps, each gathering `ids_per_step` fresh distinct rows and writing
     them back (a cache's fills and write-backs): median milliseconds of each;
  3. a host-table checkpoint of every row (`sfjax.checkpoint.save_table`, a base: a packed
     table writes each table's own width) into a temporary folder, restored into a fresh
     table: its bytes per row and the seconds of each;

and once, `device_checkpoint`: the same rows as the device backend's table (the model's
width) in a trainer's checkpoint (`Checkpointer`, orbax, which compresses: the unread
zero columns cost little there), restored into a table of zeros.

Both tables, and all restored tables, then read the same rows (`same_rows`). Ends with
one JSON line: `bytes_per_row`, `rss_mb`, `gather_ms`, `scatter_ms`,
`checkpoint_bytes_per_row`, `save_s` and `restore_s` of each, `bytes_ratio` and
`checkpoint_bytes_ratio` (packed / full), and `device_checkpoint` {`bytes_per_row`,
`save_s`, `restore_s`}.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time

import ml_collections
import numpy as np
from jax import numpy as jnp

from experiments import cli
from sfjax.checkpoint import ChangeTracker, Checkpointer, load_table, save_table
from sfjax.core import ConfigError
from sfjax.embedding import ROW_OPTIMIZERS, HostTable, TableInits, TableState, init_table_rows
from sfjax.train import TrainState

_SLOT_GROUPS = {"rowwise_adagrad": 0, "adagrad": 1, "adam": 2}  # slots: 1, E or 2E columns
_BLOCK = 1 << 18  # rows written per block while every row is written once


def _rss_bytes() -> int:
  """This process's resident memory (VmRSS), bytes."""
  with open("/proc/self/status", encoding="utf-8") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("no VmRSS line in /proc/self/status")


def table_inits(config: ml_collections.ConfigDict, packed: bool) -> tuple[TableInits, int, int]:
  """(the tables' initial rows, row width E, slot width S): tables of equal size, with
  their dims recorded only when `packed`."""
  dims = np.asarray([int(d) for d in str(config.dims).split(",")], np.int64)
  width = int(config.embed_dim) + int(config.first_order)
  groups = _SLOT_GROUPS[config.optimizer]
  slot_width = width * groups if groups else 1
  slot_row = np.zeros(slot_width, np.float32) if config.optimizer == "adam" else np.full(
      slot_width, 0.1, np.float32)
  starts = (np.arange(dims.size) * (int(config.num_rows) // dims.size)).astype(np.int64)
  inits = TableInits(starts, np.full(dims.size, 0.05), np.tile(slot_row, (dims.size, 1)),
                     dims, int(config.embed_dim))
  return (inits if packed else inits._replace(dims=None)), width, slot_width


def _empty_table(num_rows: int, inits: TableInits, width: int, slot_width: int) -> HostTable:
  """A fresh in-RAM host table of the benchmark's tables."""
  return HostTable.create_ram(num_rows, width, slot_width, seed=0, init_stddev=0.05,
                              initial_slot_row=inits.slot_rows[0], tables=inits)


def measure(config: ml_collections.ConfigDict, packed: bool, steps_ids: list[np.ndarray],
            check: np.ndarray) -> tuple[dict, HostTable]:
  """One table's figures (see the module docstring) and the table."""
  inits, width, slot_width = table_inits(config, packed)
  dimmed, _, _ = table_inits(config, True)
  gc.collect()
  before = _rss_bytes()
  table = _empty_table(int(config.num_rows), inits, width, slot_width)
  for lo in range(0, table.num_rows, _BLOCK):
    ids = np.arange(lo, min(lo + _BLOCK, table.num_rows), dtype=np.int64)
    # The same rows either way: the initial rows of the tables' dims (0 past a dim).
    table.scatter(ids, *init_table_rows(0, ids, width, dimmed))
  rss = _rss_bytes() - before
  gathers, scatters = [], []
  for ids in steps_ids:
    t0 = time.perf_counter()
    values, slots = table.gather(ids)
    t1 = time.perf_counter()
    table.scatter(ids, values, slots)
    scatters.append(time.perf_counter() - t1)
    gathers.append(t1 - t0)
  figures = {"packed": bool(table.spec.packed), "bytes_per_row": table.nbytes / table.num_rows,
             "rss_mb": rss / 1e6, "gather_ms": 1e3 * statistics.median(gathers),
             "scatter_ms": 1e3 * statistics.median(scatters)}
  return dict(figures, **_checkpoint(table, inits, width, slot_width, check)), table


def _checkpoint(table: HostTable, inits: TableInits, width: int, slot_width: int,
                check: np.ndarray) -> dict:
  """A base checkpoint of `table` restored into a fresh one: bytes per row, seconds, and
  whether the restored table reads `check`'s rows alike."""
  with tempfile.TemporaryDirectory(prefix="bench_table_widths_") as root:
    folder = os.path.join(root, "table")
    t0 = time.perf_counter()
    manifest = save_table(ChangeTracker(table), folder, None)
    t1 = time.perf_counter()
    restored = _empty_table(table.num_rows, inits, width, slot_width)
    load_table(restored, folder)
    t2 = time.perf_counter()
  stored = sum(e["bytes"] for e in manifest["chunks"].values())
  same = all(np.array_equal(a, b) for a, b in zip(restored.gather(check), table.gather(check),
                                                  strict=True))
  return {"checkpoint_bytes_per_row": stored / table.num_rows, "save_s": t1 - t0,
          "restore_s": t2 - t1, "restored_same": same}


def _device_checkpoint(table: HostTable, check: np.ndarray) -> dict:
  """The same rows as the device backend's table, at the model's width, in a trainer's
  checkpoint (`Checkpointer`: orbax compresses the dense state), restored into a table of
  zeros: dense/ bytes per row, seconds, and whether the restored rows read alike."""
  values, slots = table.read_all(max_rows=table.num_rows)
  def state(v, s):
    return TrainState(jnp.int32(1), {"w": jnp.ones(2)}, {"m": jnp.zeros(2)},
                      TableState(jnp.asarray(v), jnp.asarray(s)))
  with tempfile.TemporaryDirectory(prefix="bench_table_widths_") as root:
    ckpt = Checkpointer(root, keep=1)
    try:
      t0 = time.perf_counter()
      path = ckpt.save(state(values, slots), {})
      t1 = time.perf_counter()
      restored = ckpt.restore(path, state(np.zeros_like(values), np.zeros_like(slots)))
      t2 = time.perf_counter()
    finally:
      ckpt.close()
    stored = sum(os.path.getsize(os.path.join(d, f))
                 for d, _, files in os.walk(os.path.join(path, "dense")) for f in files)
  same = all(np.array_equal(np.asarray(a)[check], b[check])
             for a, b in zip(restored.state.table, (values, slots), strict=True))
  return {"bytes_per_row": stored / table.num_rows, "save_s": t1 - t0, "restore_s": t2 - t1,
          "restored_same": same}


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: an unknown optimizer, a bad dim, or fewer rows than tables or ids per step.
  """
  if config.optimizer not in _SLOT_GROUPS:
    known = ", ".join(k for k in _SLOT_GROUPS if k in ROW_OPTIMIZERS)
    raise ConfigError(f"config field optimizer: {config.optimizer!r} is not one of {known}")
  try:
    dims = [int(d) for d in str(config.dims).split(",")]
  except ValueError as err:
    raise ConfigError(f"config field dims: expected comma-separated integers, got "
                      f"{config.dims!r}") from err
  if any(not 0 <= d <= config.embed_dim for d in dims):
    raise ConfigError(f"config field dims: each must be in [0, embed_dim={config.embed_dim}], "
                      f"got {config.dims!r}")
  if config.num_rows < max(len(dims), config.ids_per_step):
    raise ConfigError(f"config field num_rows: {config.num_rows} is below the {len(dims)} "
                      f"tables or ids_per_step={config.ids_per_step}")
  rng = np.random.default_rng(0)
  steps_ids = [np.sort(rng.choice(config.num_rows, config.ids_per_step, replace=False))
               for _ in range(config.steps)]
  check = np.sort(rng.choice(config.num_rows, min(config.num_rows, 100_000), replace=False))
  full, full_table = measure(config, False, steps_ids, check)
  want = full_table.gather(check)
  device = _device_checkpoint(full_table, check)
  del full_table
  packed, packed_table = measure(config, True, steps_ids, check)
  got = packed_table.gather(check)
  same = (all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
          and full["restored_same"] and packed["restored_same"] and device["restored_same"])
  return {"benchmark": "bench_table_widths", "num_rows": int(config.num_rows),
          "dims": dims, "embed_dim": int(config.embed_dim),
          "width": int(config.embed_dim) + int(config.first_order),
          "optimizer": config.optimizer, "ids_per_step": int(config.ids_per_step),
          "full": full, "packed": packed,
          "bytes_ratio": packed["bytes_per_row"] / full["bytes_per_row"],
          "checkpoint_bytes_ratio": (packed["checkpoint_bytes_per_row"]
                                     / full["checkpoint_bytes_per_row"]),
          "device_checkpoint": device,
          "rss_ratio": packed["rss_mb"] / max(full["rss_mb"], 1e-9), "same_rows": same}


def print_summary(result: dict) -> None:
  """One line per table kind to stderr."""
  import sys  # pylint: disable=import-outside-toplevel
  for kind in ("full", "packed"):
    r = result[kind]
    print(f"{kind:>6}: {r['bytes_per_row']:.1f} B/row, RSS {r['rss_mb']:.0f} MB, gather "
          f"{r['gather_ms']:.2f} ms, write-back {r['scatter_ms']:.2f} ms; checkpoint "
          f"{r['checkpoint_bytes_per_row']:.1f} B/row, save {r['save_s']:.2f} s, restore "
          f"{r['restore_s']:.2f} s", file=sys.stderr)
  r = result["device_checkpoint"]
  print(f"device backend's checkpoint (model's width, orbax): {r['bytes_per_row']:.1f} B/row, "
        f"save {r['save_s']:.2f} s, restore {r['restore_s']:.2f} s", file=sys.stderr)


if __name__ == "__main__":
  cli.run_benchmark("bench_table_widths", run, print_summary)

"""Placement planner: where each embedding table lives, from memory budgets (issue #24 item 4).

Given the tables (rows, width, bytes per value, optimizer-state bytes per row), the
devices and a memory budget per device and per host, each table is placed

  replicated  the whole table on every device (small tables: no per-owner blocks),
  row         its rows split over the D devices, ceil(V/D) each (`row_sharded_table`),
  cache       a host table (split over the hosts by id) + a device cache (MixCache),

greedily, smallest table first (TorchRec's planner does the same by cost, per table):
tables are replicated while all replicated tables together stay within
`replicate_fraction` of a device's budget; the next ones are row-sharded while their
shares fit what is left of it; the rest (the largest) go to the host, with a device
cache of `cache_fraction` of their rows. Sizes only grow along that order and the
budget left only shrinks, so the placements are monotone: the largest table gets the
heaviest placement. A table that fits neither its hosts nor any device is an error.

Expected exchange per device and step, for a global batch of B examples of which the
table's ids are `ids_per_example` per example, `unique_fraction` of them distinct
(U = ceil(B x ids x fraction), at most V): replicated and cache `2 (D-1)/D U R` bytes
(the all-reduced row gradient; R = width x value bytes), row `2 (D-1) ceil(U/D) R`
(all_gather + psum_scatter of owner blocks); a cache also moves at most `2 U row_bytes`
between host and device (every unique row a miss: a fill and a write-back).

A run has ONE embedding backend today: `embedding.placement=auto` runs every table with
the heaviest placement of the plan, the largest table's (`Plan.run_placement`); the plan
is still made, and printed, per table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

from sfjax.core import feature_layout
from sfjax.core.errors import ConfigError
from sfjax.embedding import packed_rows, row_sharded_table

PLACEMENTS = ("replicated", "row", "cache")  # lightest to heaviest
SETTINGS = ("", "auto", *PLACEMENTS)  # embedding.placement ('' = embedding.backend as set)
CACHE_FRACTION = 0.05  # a cache placement's device cache: this part of its rows (cache_rows=0)


@dataclasses.dataclass(frozen=True)
class TableCost:
  """One table's size.

  Attributes:
    name: the table's name.
    num_rows: V.
    width: E, values per row.
    value_bytes: bytes per value (4: float32).
    slot_bytes: optimizer-state bytes per row (S x 4 for S float32 slots).
    ids_per_example: ids an example holds in this table (its features' capacities).
    host_row_bytes: bytes of one row with its state in a host table, when less than
      `row_bytes` (a table of a smaller dim stores only its read columns there,
      `packed_rows`); 0: `row_bytes`.
  """

  name: str
  num_rows: int
  width: int
  value_bytes: int = 4
  slot_bytes: int = 0
  ids_per_example: int = 1
  host_row_bytes: int = 0

  @property
  def row_bytes(self) -> int:
    """Bytes of one row with its optimizer state."""
    return self.width * self.value_bytes + self.slot_bytes

  @property
  def host_bytes(self) -> int:
    """Bytes of the whole table with its optimizer state in a host table."""
    return self.num_rows * (self.host_row_bytes or self.row_bytes)

  @property
  def total_bytes(self) -> int:
    """Bytes of the whole table with its optimizer state."""
    return self.num_rows * self.row_bytes


@dataclasses.dataclass(frozen=True)
class Budget:
  """The memory the tables may use.

  Attributes:
    num_devices: D, devices in all.
    device_bytes: bytes per device for rows and optimizer state.
    num_hosts: P, hosts (processes) holding a cache placement's host table (by id % P).
    host_bytes: bytes per host for host tables.
    replicate_fraction: all replicated tables together stay within this part of
      `device_bytes`.
  """

  num_devices: int
  device_bytes: int
  num_hosts: int = 1
  host_bytes: int = 0
  replicate_fraction: float = 0.25


class TablePlacement(NamedTuple):
  """Where one table goes and what it costs.

  Attributes:
    table: the table.
    placement: 'replicated', 'row' or 'cache'.
    device_bytes: bytes it takes on each device.
    host_bytes: bytes it takes on each host (cache only).
    unique_rows: U, its expected distinct rows per step.
    exchange_bytes: device-collective bytes each device sends per step.
    host_transfer_bytes: host <-> device bytes per step at most (cache only).
  """

  table: TableCost
  placement: str
  device_bytes: int
  host_bytes: int
  unique_rows: int
  exchange_bytes: int
  host_transfer_bytes: int


class Plan(NamedTuple):
  """A placement of every table, in the order given.

  Attributes:
    tables: one TablePlacement per table.
    budget: the budget it was made for.
  """

  tables: tuple[TablePlacement, ...]
  budget: Budget

  @property
  def device_bytes(self) -> int:
    """Bytes per device, all tables."""
    return sum(t.device_bytes for t in self.tables)

  @property
  def host_bytes(self) -> int:
    """Bytes per host, all tables."""
    return sum(t.host_bytes for t in self.tables)

  @property
  def exchange_bytes(self) -> int:
    """Device-collective bytes per device and step, all tables."""
    return sum(t.exchange_bytes for t in self.tables)

  @property
  def run_placement(self) -> str:
    """The placement of a run with one backend: the plan's heaviest (the largest table's)."""
    return max((t.placement for t in self.tables), key=PLACEMENTS.index)

  def describe(self) -> str:
    """The plan as a table: per table its placement, bytes per device and host, the
    expected unique rows and exchange bytes per step."""
    b = self.budget
    lines = [f"placement plan: {b.num_devices} devices x {b.device_bytes} B, {b.num_hosts} "
             f"hosts x {b.host_bytes} B (run placement: {self.run_placement})",
             f"{'table':<16} {'rows':>12} {'width':>5} {'placement':>10} {'B/device':>14} "
             f"{'B/host':>14} {'unique/step':>11} {'exchange B/step':>15} {'host B/step':>12}"]
    for t in self.tables:
      lines.append(f"{t.table.name:<16} {t.table.num_rows:>12} {t.table.width:>5} "
                   f"{t.placement:>10} {t.device_bytes:>14} {t.host_bytes:>14} "
                   f"{t.unique_rows:>11} {t.exchange_bytes:>15} {t.host_transfer_bytes:>12}")
    lines.append(f"{'total':<16} {'':>12} {'':>5} {'':>10} {self.device_bytes:>14} "
                 f"{self.host_bytes:>14} {'':>11} {self.exchange_bytes:>15}")
    return "\n".join(lines)


def table_costs(layout: feature_layout.FeatureLayout | None, num_rows: int, num_columns: int,
                width: int, slot_width: int, latent_dim: int | None = None
                ) -> tuple[TableCost, ...]:
  """The tables of a run: a feature layout's (`TableSpec`s; ids per example = the
  capacities of the features reading each), or the one concatenated table of `num_rows`
  rows and `num_columns` ids per example. Float32 values and `slot_width` float32 slots;
  with `latent_dim` (the model's D), a table of a smaller dim costs its kept columns on a
  host (`packed_rows.column_ranges`: per-element slots pack alike)."""
  if layout is None:
    return (TableCost("table", int(num_rows), width, 4, 4 * slot_width, int(num_columns)),)
  ids = {t.name: 0 for t in layout.tables}
  for f in layout.features:
    ids[f.table] += int(f.capacity)

  def host_row_bytes(dim: int) -> int:
    if latent_dim is None or not 0 < dim < latent_dim:
      return 0
    kept = sum(hi - lo for lo, hi in packed_rows.column_ranges(dim, latent_dim, width))
    groups = packed_rows.slot_groups(slot_width, width)
    slots = kept * groups if groups else slot_width
    return 4 * (kept + slots)

  return tuple(TableCost(t.name, int(t.num_rows), width, 4, 4 * slot_width, max(1, ids[t.name]),
                         host_row_bytes(t.dim))
               for t in layout.tables)


def _check(tables: Sequence[TableCost], budget: Budget) -> None:
  """Raises ConfigError naming the first bad budget or table field."""
  def need(ok: bool, field: str, message: str) -> None:
    if not ok:
      raise ConfigError(f"config field {field}: {message}")

  need(budget.num_devices >= 1, "train.num_devices", f"must be >= 1, got {budget.num_devices}")
  need(budget.device_bytes > 0, "embedding.plan.device_bytes",
       f"must be > 0 bytes per device, got {budget.device_bytes}")
  need(budget.num_hosts >= 1, "distributed.num_processes", f"must be >= 1, got {budget.num_hosts}")
  need(budget.host_bytes >= 0, "embedding.plan.host_bytes",
       f"must be >= 0 bytes per host, got {budget.host_bytes}")
  need(0 <= budget.replicate_fraction <= 1, "embedding.plan.replicate_fraction",
       f"must be in [0, 1], got {budget.replicate_fraction}")
  need(len(tables) > 0, "features.tables", "no table to place")
  seen = set()
  for t in tables:
    where = f"features.tables.{t.name}"
    need(t.name not in seen, where, "named twice")
    seen.add(t.name)
    need(t.num_rows >= 1, f"{where}.num_rows", f"must be >= 1, got {t.num_rows}")
    need(t.width >= 1, f"{where}.width", f"must be >= 1, got {t.width}")
    need(t.value_bytes >= 1, f"{where}.value_bytes", f"must be >= 1, got {t.value_bytes}")
    need(t.slot_bytes >= 0, f"{where}.slot_bytes", f"must be >= 0, got {t.slot_bytes}")
    need(t.ids_per_example >= 1, f"{where}.ids_per_example",
         f"must be >= 1, got {t.ids_per_example}")


def unique_rows(table: TableCost, batch_size: int, unique_fraction: float) -> int:
  """U, the expected distinct rows of a step: ceil(B x ids x fraction), at most V."""
  ids = batch_size * table.ids_per_example
  return min(table.num_rows, math.ceil(round(ids * unique_fraction, 6)))


def _costs(table: TableCost, placement: str, budget: Budget, batch_size: int,
           unique_fraction: float) -> TablePlacement:
  d, u = budget.num_devices, unique_rows(table, batch_size, unique_fraction)
  grad_bytes = table.width * table.value_bytes  # one row's gradient
  if placement == "replicated":
    return TablePlacement(table, placement, table.total_bytes, 0, u,
                          row_sharded_table.exchange_bytes(u, grad_bytes, d, "replicated"), 0)
  if placement == "row":
    per = -(-table.num_rows // d) * table.row_bytes
    return TablePlacement(table, placement, per, 0, u,
                          row_sharded_table.exchange_bytes(u, grad_bytes, d, "row"), 0)
  cache_rows = max(1, math.ceil(round(table.num_rows * CACHE_FRACTION, 6)))
  return TablePlacement(table, "cache", cache_rows * table.row_bytes,
                        -(-table.host_bytes // budget.num_hosts), u,
                        row_sharded_table.exchange_bytes(u, grad_bytes, d, "replicated"),
                        2 * u * table.row_bytes)


def plan_placement(tables: Sequence[TableCost], budget: Budget, batch_size: int,
                   unique_fraction: float = 1.0) -> Plan:
  """Places every table (the module docstring's rule).

  Args:
    tables: the tables, in any order (the plan keeps it).
    budget: devices, hosts and their byte budgets.
    batch_size: B, the global batch, for the exchange estimate.
    unique_fraction: expected distinct ids / ids of a step, in (0, 1].

  Returns:
    The Plan.

  Raises:
    ConfigError: a bad budget or table (naming the field), or a table that fits
      neither on the devices nor on the hosts.
  """
  _check(tables, budget)
  if not 0 < unique_fraction <= 1:
    raise ConfigError(f"config field embedding.plan.unique_fraction: must be in (0, 1], got "
                      f"{unique_fraction}")
  device_left, replicated = budget.device_bytes, 0
  host_left = budget.host_bytes
  placed: dict[str, TablePlacement] = {}
  for table in sorted(tables, key=lambda t: (t.total_bytes, t.name)):
    rep = _costs(table, "replicated", budget, batch_size, unique_fraction)
    row = _costs(table, "row", budget, batch_size, unique_fraction)
    if (replicated + rep.device_bytes <= budget.replicate_fraction * budget.device_bytes
        and rep.device_bytes <= device_left):
      choice = rep
      replicated += rep.device_bytes
    elif row.device_bytes <= device_left:
      choice = row
    else:
      choice = _costs(table, "cache", budget, batch_size, unique_fraction)
      if choice.host_bytes > host_left or choice.device_bytes > device_left:
        raise ConfigError(
            f"config field embedding.plan: table {table.name!r} ({table.total_bytes} B) fits "
            f"neither the devices ({row.device_bytes} B per device as rows, {device_left} B "
            f"left of {budget.device_bytes}) nor the hosts ({choice.host_bytes} B per host with "
            f"a {choice.device_bytes} B cache, {host_left} B left of {budget.host_bytes})")
      host_left -= choice.host_bytes
    device_left -= choice.device_bytes
    placed[table.name] = choice
  return Plan(tuple(placed[t.name] for t in tables), budget)

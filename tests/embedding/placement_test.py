"""The placement planner against hand-computed plans, its budget boundaries and its errors."""

import dataclasses

import pytest

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.embedding import placement as pl

# Rows of 16 bytes: width 2 x 4-byte values + 8 bytes of optimizer state.
SMALL = pl.TableCost("small", 10, 2, 4, 8, ids_per_example=1)  # 160 B
MID = pl.TableCost("mid", 100, 2, 4, 8, ids_per_example=2)  # 1600 B
BIG = pl.TableCost("big", 1000, 2, 4, 8, ids_per_example=3)  # 16000 B


def _budget(device_bytes=2000, hosts=2, host_bytes=10000, fraction=0.25, devices=4):
  return pl.Budget(devices, device_bytes, hosts, host_bytes, fraction)


def test_three_tables_go_replicated_row_and_cache_as_computed_by_hand():
  plan = pl.plan_placement([BIG, SMALL, MID], _budget(), batch_size=64, unique_fraction=0.5)
  by_name = {t.table.name: t for t in plan.tables}
  assert [t.table.name for t in plan.tables] == ["big", "small", "mid"]  # the order given
  # small: 160 B <= 25% of 2000 -> replicated. U = min(10, 64 x 1 x 0.5) = 10;
  #   all-reduce 2 x 3/4 x 10 rows x 8 B = 120 B per device.
  assert by_name["small"] == pl.TablePlacement(SMALL, "replicated", 160, 0, 10, 120, 0)
  # mid: 160 + 1600 > 500 -> row: ceil(100/4) = 25 rows x 16 B = 400 B (1840 left).
  #   U = 64; blocks of 16 rows: 2 x 3 x 16 x 8 = 768 B.
  assert by_name["mid"] == pl.TablePlacement(MID, "row", 400, 0, 64, 768, 0)
  # big: 250 x 16 = 4000 B > 1440 left -> cache: 5% = 50 rows x 16 = 800 B per device,
  #   16000 / 2 hosts = 8000 B per host. U = 96: all-reduce 2 x 3/4 x 96 x 8 = 1152 B;
  #   fills + write-backs at most 2 x 96 x 16 = 3072 B.
  assert by_name["big"] == pl.TablePlacement(BIG, "cache", 800, 8000, 96, 1152, 3072)
  assert (plan.device_bytes, plan.host_bytes, plan.exchange_bytes) == (1360, 8000, 2040)
  assert plan.run_placement == "cache"
  text = plan.describe()
  assert "run placement: cache" in text and "small" in text and "  1360 " in text


def test_replicated_boundary_is_the_fraction_of_the_device_budget():
  # 25% of 640 B = 160 B: the small table (160 B) just fits; 159.99 B does not.
  assert pl.plan_placement([SMALL], _budget(640), 64).tables[0].placement == "replicated"
  below = pl.plan_placement([SMALL], _budget(640, fraction=0.2499), 64).tables[0]
  assert (below.placement, below.device_bytes) == ("row", 3 * 16)  # ceil(10/4) rows
  assert pl.plan_placement([SMALL], _budget(640), 64).run_placement == "replicated"


def test_row_boundary_is_the_device_budget_left():
  at = pl.plan_placement([MID], _budget(400, fraction=0.0), 64)
  assert (at.tables[0].placement, at.tables[0].device_bytes, at.run_placement) == ("row", 400, "row")
  under = pl.plan_placement([MID], _budget(399, fraction=0.0), 64).tables[0]
  assert (under.placement, under.device_bytes, under.host_bytes) == ("cache", 5 * 16, 800)


def test_host_boundary_and_a_table_that_fits_nowhere():
  fits = pl.plan_placement([BIG], _budget(1000, hosts=1, host_bytes=16000, fraction=0.0), 64)
  assert fits.tables[0].host_bytes == 16000
  with pytest.raises(ConfigError, match=r"^config field embedding\.plan: table 'big' \(16000 B\) "
                     r"fits neither the devices .*4000 B per device.* nor the hosts \(16000 B"):
    pl.plan_placement([BIG], _budget(1000, hosts=1, host_bytes=15999, fraction=0.0), 64)


def test_one_device_exchanges_nothing_and_unique_rows_round_up():
  plan = pl.plan_placement([MID], _budget(devices=1), 10, unique_fraction=0.15)
  assert plan.tables[0].unique_rows == 3  # ceil(10 x 2 x 0.15)
  assert plan.exchange_bytes == 0


@pytest.mark.parametrize("budget,tables,match", [
    (_budget(0), [SMALL], r"embedding\.plan\.device_bytes: must be > 0"),
    (_budget(host_bytes=-1), [SMALL], r"embedding\.plan\.host_bytes: must be >= 0"),
    (_budget(fraction=1.5), [SMALL], r"embedding\.plan\.replicate_fraction: must be in \[0, 1\]"),
    (_budget(devices=0), [SMALL], r"train\.num_devices: must be >= 1"),
    (_budget(hosts=0), [SMALL], r"distributed\.num_processes: must be >= 1"),
    (_budget(), [], r"features\.tables: no table"),
    (_budget(), [SMALL, SMALL], r"features\.tables\.small: named twice"),
    (_budget(), [pl.TableCost("x", 0, 2)], r"features\.tables\.x\.num_rows: must be >= 1"),
    (_budget(), [pl.TableCost("x", 5, 0)], r"features\.tables\.x\.width: must be >= 1"),
    (_budget(), [pl.TableCost("x", 5, 2, slot_bytes=-4)], r"features\.tables\.x\.slot_bytes"),
])
def test_bad_budgets_and_tables_give_one_line_errors(budget, tables, match):
  with pytest.raises(ConfigError, match=r"^config field " + match) as info:
    pl.plan_placement(tables, budget, 64)
  assert "\n" not in str(info.value)


def test_bad_unique_fraction_names_the_field():
  with pytest.raises(ConfigError, match=r"embedding\.plan\.unique_fraction: must be in \(0, 1\]"):
    pl.plan_placement([SMALL], _budget(), 64, unique_fraction=0.0)


def test_table_costs_of_a_layout_and_of_one_table():
  layout = fl.FeatureLayout(
      (fl.TableSpec("user", 300), fl.TableSpec("item", 500)),
      (fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item"),
       fl.FeatureSpec("history", "item", "sequence", 5, "mean")))
  costs = pl.table_costs(layout, 800, 7, width=4, slot_width=4)
  assert costs == (pl.TableCost("user", 300, 4, 4, 16, 1), pl.TableCost("item", 500, 4, 4, 16, 6))
  assert pl.table_costs(None, 800, 7, 4, 1) == (pl.TableCost("table", 800, 4, 4, 4, 7),)


def test_a_table_of_a_smaller_dim_costs_its_stored_columns_on_a_host():
  # DeepFM-like rows: 4 latent columns + 1 first-order (E = 5); item has dim 1.
  layout = fl.FeatureLayout(
      (fl.TableSpec("user", 300), fl.TableSpec("item", 500, dim=1)),
      (fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item")))
  adagrad = pl.table_costs(layout, 800, 2, width=5, slot_width=5, latent_dim=4)
  assert [t.host_row_bytes for t in adagrad] == [0, 4 * (2 + 2)]  # columns 0 and 4, and slots
  rowwise = pl.table_costs(layout, 800, 2, width=5, slot_width=1, latent_dim=4)
  assert [t.host_row_bytes for t in rowwise] == [0, 4 * (2 + 1)]
  adam = pl.table_costs(layout, 800, 2, width=5, slot_width=10, latent_dim=4)
  assert adam[1].host_row_bytes == 4 * (2 + 4) and adam[1].row_bytes == 4 * 15
  assert pl.table_costs(layout, 800, 2, 5, 5)[1].host_row_bytes == 0  # no latent dim given
  item = adagrad[1]
  assert (item.total_bytes, item.host_bytes) == (500 * 40, 500 * 16)
  # On a host the packed table fits a budget its full rows would not.
  budget = pl.Budget(1, 1000, 1, 8000, 0.0)
  placed = pl.plan_placement([item], budget, 8).tables[0]
  assert (placed.placement, placed.host_bytes) == ("cache", 8000)
  with pytest.raises(ConfigError, match="nor the hosts"):
    pl.plan_placement([dataclasses.replace(item, host_row_bytes=0)], budget, 8)

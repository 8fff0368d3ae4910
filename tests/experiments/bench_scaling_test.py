"""experiments/bench_scaling.py in-process at smoke size on 2 of the fake CPU devices, both cache
shardings, VSI on/off."""

import math

import jax
import pytest

from experiments import bench_scaling
from experiments.configs import bench_scaling as bench_config
from sfjax.core.errors import ConfigError


def test_bench_scaling_smoke():
  final = bench_scaling.run(bench_config.get_config("smoke"))
  assert final["benchmark"] == "bench_scaling" and final["platform"] == "cpu"
  assert final["devices_visible"] == jax.local_device_count() and not final["skipped"]
  runs = {(r["cache_sharding"], r["vsi"]): r for r in final["results"]}
  assert set(runs) == {(s, v) for s in ("replicated", "row") for v in ("on", "off")}
  b_f = 32 * final["num_fields"]
  per_device = 2 * b_f  # default cache_rows: lookahead x B x F
  for (sharding, vsi), r in runs.items():
    assert r["devices"] == 2 and r["cache_rows_per_device"] == per_device
    assert r["cache_capacity_rows"] == per_device * (2 if sharding == "row" else 1)
    # Same data, same math: every layout trains to the first run's losses and table.
    assert r["max_loss_diff"] < 1e-5 and r["max_table_diff"] < 1e-5, r
    assert math.isfinite(r["examples_per_sec"]) and r["examples_per_sec"] > 0
    assert r["h2d_bytes_per_step"] > 0 and 0 <= r["cache_hit_rate"] <= 1
    assert r["collective_ring_bytes_per_step"] > 0
    if vsi == "off":  # one row per id occurrence (row-sharded: per-owner blocks >= B*F / 2)
      assert r["mean_exchanged_rows_per_step"] == b_f if sharding == "replicated" else (
          b_f <= r["mean_exchanged_rows_per_step"] <= 2 * b_f)
    else:
      assert r["mean_unique_per_step"] <= r["mean_exchanged_rows_per_step"] <= b_f
  for sharding in ("replicated", "row"):  # VSI cuts the exchanged rows and their bytes
    on, off = runs[(sharding, "on")], runs[(sharding, "off")]
    assert on["collective_ring_bytes_per_step"] < off["collective_ring_bytes_per_step"]
  # Row-sharded: owner blocks (all_gather + reduce-scatter) move fewer bytes than an
  # owner-masked psum lookup + all-reduced gradient would on the same steps, and each
  # device receives only its own fills (less host->device traffic than replicated swaps).
  row, rep = runs[("row", "on")], runs[("replicated", "on")]
  exchange = row["exchange"]
  assert 0 < exchange["owner_blocks_allgather_reducescatter_ring_bytes_per_step"] < (
      exchange["psum_lookup_allreduce_grad_ring_bytes_per_step"])
  assert row["h2d_bytes_per_step"] < rep["h2d_bytes_per_step"]


def test_device_counts_beyond_the_visible_ones_are_skipped():
  config = bench_config.get_config("smoke")
  config.devices, config.shardings, config.vsi = (1, 64), "replicated", "on"
  final = bench_scaling.run(config)
  assert [(r["devices"], r["max_loss_diff"], r["max_table_diff"]) for r in final["results"]] == [
      (1, 0.0, 0.0)]
  (skip,) = final["skipped"]
  assert skip["devices"] == 64 and "devices visible" in skip["reason"]


@pytest.mark.parametrize("field,value", [("shardings", "replicated,column"), ("vsi", "maybe"),
                                         ("devices", ())])
def test_bad_layout_fields_are_named(field, value):
  config = bench_config.get_config("smoke")
  config[field] = value
  with pytest.raises(ConfigError, match=f"config field {field}:"):
    bench_scaling.run(config)

"""Smoke run of experiments/bench_scaling.py on 2 fake CPU devices, both cache shardings, VSI on/off."""

import math


def test_bench_scaling_smoke(run_bench):
  final = run_bench("experiments.bench_scaling", "--devices=2", "--steps=3", "--batch_size=32",
                    "--cardinality_scale=0.0005", "--mlp_dims=8", "--embed_dim=4")
  assert final["benchmark"] == "bench_scaling" and final["platform"] == "cpu"
  assert final["devices_visible"] == 2 and not final["skipped"]
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

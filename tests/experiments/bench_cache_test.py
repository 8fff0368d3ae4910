"""experiments/bench_cache.py in-process at smoke size: planner hit rates and traffic on a tiny
stream."""

import math

import pytest

from experiments import bench_cache
from experiments.configs import bench_cache as bench_config
from sfjax.core.errors import ConfigError


def test_bench_cache_smoke():
  # 3443 table rows at this scale; fractions: too small (error entry), evicting, holds all ids.
  final = bench_cache.run(bench_config.get_config("smoke"))
  assert final["benchmark"] == "bench_cache"
  assert (final["steps"], final["batch_size"], final["lookahead"]) == (40, 16, 2)
  assert final["row_bytes"] == (17 + 17) * 4
  timing = final["planner_ms_per_batch_50k_unique_1M_slots"]
  assert set(timing) == {"lru", "lfu"} and all(ms > 0 for ms in timing.values())

  baselines = {b["zipf"]: b for b in final["baselines"]}
  assert set(baselines) == {1.05, 1.2}
  for b in baselines.values():
    assert b["num_rows"] == 3443 and 0 < b["distinct_ids"] <= b["num_rows"]
    assert b["no_vsi_bytes_per_example"] == 26 * final["row_bytes"]  # B*F rows per B examples
    assert 0 < b["no_cache_bytes_per_example"] < b["no_vsi_bytes_per_example"]

  results = final["results"]
  assert [(e["zipf"], e["cache_fraction"]) for e in results] == [
      (z, f) for z in (1.05, 1.2) for f in (0.05, 0.15, 0.5)]
  for entry in results:
    base = baselines[entry["zipf"]]
    assert entry["capacity"] == int(entry["cache_fraction"] * base["num_rows"])
    if entry["cache_fraction"] == 0.05:  # below lookahead x unique ids per batch
      assert "cache too small" in entry["error"]
      continue
    assert "error" not in entry
    assert 0.0 <= entry["belady_hit_rate"] <= 1.0 and 0.0 <= entry["belady_steady_hit_rate"] <= 1.0
    for policy in ("lru", "lfu"):
      s = entry[policy]
      assert all(math.isfinite(v) for v in s.values()), s
      assert 0.0 <= s["hit_rate"] <= entry["belady_hit_rate"] + 1e-12  # Belady is the ceiling
      assert 0.0 <= s["steady_hit_rate"] <= 1.0
      # Fills are the misses: h2d traffic = miss rate x the no-cache traffic.
      assert math.isclose(s["h2d_bytes_per_example"],
                          (1 - s["hit_rate"]) * base["no_cache_bytes_per_example"], rel_tol=1e-9)
      assert math.isclose(s["d2h_bytes_per_example"],
                          s["evictions"] * final["row_bytes"] / (40 * 16), rel_tol=1e-9)
      if entry["cache_fraction"] == 0.5:  # holds every distinct id: only cold misses
        assert s["evictions"] == 0
        assert math.isclose(s["hit_rate"], entry["belady_hit_rate"], rel_tol=1e-12)
        accesses = base["unique_per_batch"] * 40
        assert math.isclose(s["hit_rate"], 1 - base["distinct_ids"] / accesses, rel_tol=1e-9)
      else:
        assert s["evictions"] > 0


def test_one_policy_and_no_timing():
  config = bench_config.get_config("smoke")
  config.policies, config.timing_steps, config.zipf = "lfu", 0, (1.2,)
  final = bench_cache.run(config)
  assert final["planner_ms_per_batch_50k_unique_1M_slots"] == {}
  assert all("lru" not in e and "lfu" in e for e in final["results"] if "error" not in e)


def test_unknown_policy_is_named():
  config = bench_config.get_config("smoke")
  config.policies = "lru,fifo"
  with pytest.raises(ConfigError, match=r"config field policies: unknown \['fifo'\]"):
    bench_cache.run(config)

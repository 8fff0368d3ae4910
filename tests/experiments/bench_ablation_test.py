"""experiments/bench_ablation.py in-process at smoke size (rows a-e; d and e on the 8 fake
CPU devices)."""

import math

import numpy as np
import pytest

from experiments import bench_ablation
from experiments.configs import bench_ablation as bench_config
from sfjax.core.errors import ConfigError

FIELDS = ("name", "examples_per_sec", "h2d_bytes_per_example", "d2h_bytes_per_example",
          "collective_bytes_per_step", "hit_rate", "loss")


@pytest.mark.slow
def test_bench_ablation_smoke(tmp_path):
  config = bench_config.get_config("smoke")
  config.plot = str(tmp_path / "ablation.png")
  final = bench_ablation.run(config)
  rows = {r["name"]: r for r in final["rows"]}
  assert list(rows) == list(bench_ablation.ROWS.values())
  for r in rows.values():
    assert set(FIELDS) <= set(r), r
    assert math.isfinite(r["examples_per_sec"]) and r["examples_per_sec"] > 0
    assert 0 <= r["hit_rate"] <= 1 and math.isfinite(r["loss"])
  host, cache, dedup = rows["host_ps"], rows["+cache"], rows["+vsi"]
  # The host PS moves every occurrence's row both ways and caches nothing.
  b_f = config.batch_size * 26
  row_bytes = 4 * (config.embed_dim + 1)
  assert host["hit_rate"] == 0 and host["d2h_bytes_per_example"] >= b_f * row_bytes / config.batch_size
  assert host["h2d_bytes_per_example"] > b_f * row_bytes / config.batch_size
  # VSI dedup moves fewer bytes than the cache without it; host aggregation needs no collective.
  assert dedup["h2d_bytes_per_example"] < cache["h2d_bytes_per_example"]
  assert host["collective_bytes_per_step"] == cache["collective_bytes_per_step"] == 0
  assert rows["+device_sync"]["collective_bytes_per_step"] > 0
  # Same data, same math: the host PS trains the cache path's model.
  assert final["max_loss_diff_host_ps_vs_cache"] < 1e-5
  assert np.isclose(host["loss"], dedup["loss"], atol=1e-5)
  assert (tmp_path / "ablation.png").stat().st_size > 0


def test_bench_ablation_rejects_unknown_rows():
  config = bench_config.get_config("smoke")
  config.rows = "a,z"
  with pytest.raises(ConfigError, match="rows"):
    bench_ablation.run(config)

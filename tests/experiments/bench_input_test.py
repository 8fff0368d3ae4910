"""experiments/bench_input.py in-process at smoke size: text vs binary input rates on a tiny file."""

import importlib.util
import math

import pytest

from experiments import bench_input
from experiments.configs import bench_input as bench_config
from sfjax.core.errors import ConfigError

_HAS_GRAIN = importlib.util.find_spec("grain") is not None


def test_bench_input_smoke(tmp_path):
  config = bench_config.get_config("smoke")
  config.workdir = str(tmp_path / "files")
  final = bench_input.run(config)
  assert final["benchmark"] == "bench_input" and final["num_shards"] == 3
  assert final["block_rows"] == 64
  assert final["binary_examples"] == 20000 // 256 * 256
  for key in ("text_lines_per_s", "preprocess_lines_per_s", "binary_examples_per_s",
              "binary_shuffled_examples_per_s", "binary_block_examples_per_s",
              "binary_block_ahead_examples_per_s",
              "reader_examples_per_s", "index_examples_per_s", "index_half_examples_per_s",
              "index_block_examples_per_s", "index_block_half_examples_per_s") + (("grain_examples_per_s",) if _HAS_GRAIN else ()):
    assert math.isfinite(final[key]) and final[key] > 0, key
  if not _HAS_GRAIN:  # grain is optional (evaluated, not used: see the module docstring)
    assert final["grain_examples_per_s"] is None
  assert all(len(v) == 2 for v in final["runs"].values())
  stages = final["block_stage_ns_per_example"]
  assert set(stages) == {"copy", "permutation", "gather", "total"}
  assert all(stages[k] > 0 for k in ("permutation", "gather", "total")), stages
  assert stages["copy"] + stages["permutation"] + stages["gather"] == pytest.approx(stages["total"])
  assert set(final["resume_startup_seconds"]) == {"10", "300"}
  # A resume starts at its position: the start-up does not grow with the step.
  startup = final["resume_startup_seconds"]
  assert startup["300"] < 5 * startup["10"] + 0.01, startup
  # 26 int32 ids + 13 float32 dense + a float32 label, plus .npy headers.
  assert 160 <= final["shard_bytes_per_example"] < 161
  assert math.isclose(final["speedup_vs_text"],
                      final["binary_examples_per_s"] / final["text_lines_per_s"])
  assert (tmp_path / "files" / "train.tsv").exists()  # a given workdir is kept


def test_fewer_rows_than_a_batch_is_named():
  config = bench_config.get_config("smoke")
  config.rows = 100
  with pytest.raises(ConfigError, match="config field rows: 100 is less than one batch of 256"):
    bench_input.run(config)

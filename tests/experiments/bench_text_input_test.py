"""experiments/bench_text_input.py in-process at smoke size: the chunked text feed's rate and
its resume start-up, which parses the buffer's lines whatever the step."""

import math

import pytest

from experiments import bench_text_input
from experiments.configs import bench_text_input as bench_config
from sfjax.core.errors import ConfigError


def test_bench_text_input_smoke(tmp_path):
  config = bench_config.get_config("smoke")
  config.workdir = str(tmp_path / "files")
  final = bench_text_input.run(config)
  assert final["benchmark"] == "bench_text_input" and final["chunks"] == 1
  for key in ("stream_lines_per_s", "feed_lines_per_s", "chunk_index_seconds"):
    assert math.isfinite(final[key]) and final[key] > 0, key
  assert set(final["resume_startup_seconds"]) == {"10", "300"}
  # A restart parses the lines of the rows waiting (the 512 buffered, < 1 chunk + 1 batch
  # more), not the batches before it: the same work after 10 and after 300 batches.
  parsed = final["resume_lines_parsed"]
  assert 512 <= parsed["10"] < 512 + 3000 and 512 <= parsed["300"] < 512 + 3000, parsed
  assert final["replay_seconds"]["300"] > final["replay_seconds"]["10"]
  assert (tmp_path / "files" / "train.tsv").exists()  # a given workdir is kept


def test_fewer_rows_than_a_batch_is_named():
  config = bench_config.get_config("smoke")
  config.rows = 100
  with pytest.raises(ConfigError, match="config field rows: 100 is less than one batch of 256"):
    bench_text_input.run(config)

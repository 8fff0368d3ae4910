"""experiments/bench_compress.py in-process at smoke size: a search per dots choice."""

import pytest

from experiments import bench_compress
from experiments.configs import bench_compress as bench_config
from sfjax.core.errors import ConfigError


@pytest.mark.slow  # ~6 s (four searches); the fast tier stays under 5 minutes
def test_bench_compress_smoke_times_each_choice():
  config = bench_config.get_config("smoke")
  config.rounds = 2
  final = bench_compress.run(config)
  assert final["benchmark"] == "bench_compress" and final["candidates"] == 3
  assert final["resolved"] == {"xla": "xla", "eigen": "eigen"}
  assert [len(s) for s in final["seconds"].values()] == [2, 2]
  for choice, times in final["seconds"].items():
    assert min(times) > 0
    assert final["median_seconds"][choice] == pytest.approx(sum(times) / 2)  # two: their mean
  assert final["speedup"]["eigen"] == pytest.approx(
      final["median_seconds"]["xla"] / final["median_seconds"]["eigen"])
  assert final["max_auc_diff"] < 1e-3  # float rounding only


def test_bad_choices_and_variants_are_named():
  for choices in ("", "xla,fast", " , "):
    config = bench_config.get_config("smoke")
    config.choices = choices
    with pytest.raises(ConfigError, match=r"^config field choices: must list some of 'auto', "
                       r"'eigen', 'xla', got "):
      bench_compress.run(config)
  with pytest.raises(ValueError, match="unknown config variant 'big'"):
    bench_config.get_config("big")

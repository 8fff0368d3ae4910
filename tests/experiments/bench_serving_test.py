"""experiments/bench_serving.py: the smoke run in-process (a server subprocess), config checks."""

import json
import math

import pytest

from experiments import bench_serving
from experiments.configs import bench_serving as bench_config
from sfjax.core import ConfigError


def _config(**overrides):
  config = bench_config.get_config("smoke")
  config.update(overrides)
  return config


def _assert_floor(batch: int, figures: dict) -> None:
  """The floor (the forward alone, timed beside predict) and its ratio and FLOP rate."""
  assert math.isclose(figures["floor_examples_per_sec"], batch / (figures["floor_ms"] * 1e-3))
  assert math.isclose(figures["predict_over_floor"], figures["floor_ms"] / figures["ms"])
  assert 0 < figures["predict_over_floor"] <= 1.5  # predict does the floor's work and more
  # smoke MLP 16 on 26 x 4 + 13 inputs: ~2 x (117 x 16 + 16) FLOPs per example, and more
  assert 2 * (117 * 16 + 16) <= figures["flops_per_example"] < 20_000
  assert math.isclose(figures["floor_gflops_per_sec"],
                      figures["flops_per_example"] * figures["floor_examples_per_sec"] / 1e9)


@pytest.mark.slow  # trains a tiny model, then serves it from a subprocess
def test_bench_serving_smoke():
  final = bench_serving.run(_config())
  json.dumps(final)  # one JSON line
  assert final["benchmark"] == "bench_serving" and final["mode"] == "both"
  http = final["http"]
  assert http["server_alive_after"]
  levels = http["levels"]
  assert [(lv["request_size"], lv["client"], lv["concurrency"]) for lv in levels] == [
      (size, client, c) for size in (1, 64) for client in ("raw", "httpx") for c in (1, 4)]
  assert set(http["peak"]) == {"1", "64"}
  assert {lv["client"] for lv in http["peak"].values()} == {"raw"}
  assert http["server"]["stack"].endswith("http=httptools loop=uvloop")
  for lv in levels + list(http["peak"].values()):
    assert lv["server_cpu_ms"] > 0 and lv["client_cpu_ms"] > 0
    assert lv["errors"] == 0 and lv["lost"] == 0, lv
    assert lv["requests"] == lv["sent"] > 0
    assert math.isclose(lv["qps"], lv["requests"] / lv["seconds"])
    assert math.isclose(lv["examples_per_sec"], lv["qps"] * lv["request_size"])
    assert 0 < lv["p50_ms"] <= lv["p95_ms"] <= lv["p99_ms"]
    # Bounded in time (1 s or 2 s, plus the last requests in flight) and in count.
    assert lv["seconds"] < 2.0 + 10.0 and lv["sent"] <= 2_000
    assert lv["mean_batch"] >= lv["request_size"]  # the server's batches hold whole requests
  for peak in http["peak"].values():  # the long run: its 2 s, unless its request count ends it
    assert peak["concurrency"] == 4
    assert peak["seconds"] >= 2.0 or peak["sent"] == 2_000, peak
  inproc = final["inprocess"]
  assert set(inproc["batches"]) == {"1", "64"}
  assert inproc["device_table"] and inproc["compiler_options"] == {}
  for b, figures in inproc["batches"].items():
    assert math.isclose(figures["examples_per_sec"], int(b) / (figures["ms"] * 1e-3))
    _assert_floor(int(b), figures)
    assert figures["host_gather_ms"] > 0
  assert inproc["parse_records_per_sec"] > 0
  assert "train_examples_per_sec" not in inproc  # smoke skips the training step


@pytest.mark.slow  # trains a tiny cache-backend run, then serves it from a subprocess
def test_bench_serving_huge_smoke():
  final = bench_serving.run(bench_config.get_config("huge_smoke"))
  json.dumps(final)  # one JSON line
  assert (final["mode"], final["table_storage"]) == ("huge", "lazy")
  assert 0 < final["materialised_rows"] < final["table_rows"] // 2  # lazily initialised
  assert final["table_rows"] > 30_000  # cardinality scale 1e-3: ~34k rows
  assert final["bundle_bytes"] < final["table_bytes_if_dense"]
  assert 0 < final["peak_rss_bytes"] < 3 << 30
  assert final["training_modules_loaded"] == []  # the serving process loads no training code
  assert set(final["batches"]) == {"64", "256"} and final["request_examples"] > 256
  for b, figures in final["batches"].items():
    assert figures["requests"] >= 3 and figures["examples_per_sec"] > 0
    assert 0.0 <= figures["hit_rate"] <= 1.0
    rows_per_request = int(b) * final["num_fields"]
    assert 0 <= figures["bytes_per_request"] <= rows_per_request * final["embed_dim"] * 4
  assert final["batches"]["64"]["hit_rate"] > 0  # the cache keeps the hot rows


def test_request_bodies_cycle_through_the_lines():
  bodies = bench_serving.request_bodies(["a", "b", "c"], 2)
  assert [json.loads(b)["records"] for b in bodies] == [["a", "b"]]
  bodies = bench_serving.request_bodies(["a", "b", "c"], 1)
  assert [json.loads(b)["records"] for b in bodies] == [["a"], ["b"], ["c"]]
  assert [json.loads(b)["records"] for b in bench_serving.request_bodies(["a"], 3)] == [
      ["a", "a", "a"]]


def test_parse_clients():
  assert bench_serving.parse_clients("raw, httpx") == ("raw", "httpx")
  assert bench_serving.parse_clients("httpx") == ("httpx",)


def test_time_calls_is_bounded_in_count():
  calls = []
  median = bench_serving.time_calls(lambda: calls.append(1), seconds=60.0, reps=7)
  assert len(calls) == 8 and median >= 0  # one untimed call, then 7 timed


def test_server_env_drops_only_the_fake_device_flag(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_foo=1")
  env = bench_serving.server_env()
  assert env["XLA_FLAGS"] == "--xla_cpu_foo=1" and env["JAX_PLATFORMS"] == "cpu"


def test_training_config_is_the_issues_workload():
  c = bench_serving.training_config(bench_config.get_config(), "/data")
  assert (c.model.name, c.model.embed_dim, tuple(c.model.mlp_dims)) == (
      "deepfm", 16, (400, 400, 400))
  assert (c.data.format, c.data.hash_rows) == ("criteo", 100_000)  # 26 fields x 100k rows
  assert c.data.train_path == "/data/train.tsv" and c.train.steps == 4


def test_smoke_variant_and_unknown_variant():
  smoke = bench_config.get_config("smoke")
  assert smoke.peak_duration_s <= 5 and not smoke.train_step
  assert bench_config.get_config().peak_duration_s == 60.0  # the issue's 60 s run
  with pytest.raises(ValueError, match="unknown config variant 'big'"):
    bench_config.get_config("big")


@pytest.mark.parametrize("field,value", [("mode", "grpc"), ("concurrency", (0, 4)),
                                         ("request_sizes", ()), ("duration_s", 0.0),
                                         ("max_requests", 0), ("client", "raw,curl"),
                                         ("client", ""), ("server_http", "hyper"),
                                         ("server_loop", "trio"),
                                         ("compiler_options", "use_onednn=true")])
def test_bad_fields_are_named(field, value):
  with pytest.raises(ConfigError, match=f"config field {field}:"):
    bench_serving.run(_config(**{field: value}))


def test_the_training_step_ratio_needs_the_same_mlp():
  with pytest.raises(ConfigError, match="config field train_step: .* not \\(16,\\)"):
    bench_serving.run(_config(train_step=True))


"""experiments/bench_gpu.py on CPU at smoke size: benchmarks run (each in its own subprocess, the
point of bench_gpu) and land in one JSON, and the missing GPU is stated as skipped with the
reason."""

import pytest

from experiments import bench_gpu, cli
from experiments.configs import bench_gpu as bench_config
from sfjax.core.errors import ConfigError


def test_device_counts():
  assert bench_gpu.device_counts(1) == [1]
  assert bench_gpu.device_counts(8) == [1, 2, 4, 8]
  assert bench_gpu.device_counts(6) == [1, 2, 4, 6]


def test_plans_name_every_benchmark_by_its_config_file():
  plan = bench_gpu.plan(smoke=True, platform="cpu", visible=1)
  assert set(plan) == set(bench_gpu.BENCHMARKS)
  for name, (command, _) in plan.items():
    assert command[:2] == [f"experiments.bench_{name}",
                           f"--config={cli.config_path(f'bench_{name}')}:smoke"]
  gpu = bench_gpu.plan(smoke=False, platform="gpu", visible=8)
  assert "--config.devices=1,2,4,8" in gpu["scaling"][0]
  assert "--config.floor=True" in gpu["train"][0]  # the floor lives in experiments/


def test_bench_gpu_smoke():
  # Two of the four benchmarks (each one's own smoke test runs the others): the wiring,
  # the one JSON, and what was skipped and why.
  config = bench_config.get_config("smoke")
  config.only = "input,trials"
  final = bench_gpu.run(config)
  assert final["benchmark"] == "bench_gpu" and final["platform"] == "cpu" and final["smoke"]
  assert "no GPU visible" in final["skipped"]["gpu"]
  assert set(final["runs"]) == {"input", "trials"}
  for name, run in final["runs"].items():
    assert run["status"] == "done", (name, run.get("reason"), run.get("stderr_tail"))
    assert run["result"]["benchmark"] == f"bench_{name}"
  assert final["runs"]["trials"]["result"]["steps_per_trial"] == 3  # the smoke variant ran
  assert "joint_space" not in final["runs"]["trials"]["result"]
  assert final["skipped"]["train"] == final["skipped"]["scaling"] == "not in config.only"


def test_unknown_benchmark_in_only_is_named():
  config = bench_config.get_config("smoke")
  config.only = "input,gpu"
  with pytest.raises(ConfigError, match=r"config field only: unknown \['gpu'\]"):
    bench_gpu.run(config)

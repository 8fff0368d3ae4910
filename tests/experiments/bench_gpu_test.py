"""Smoke run of experiments/bench_gpu.py on CPU: every benchmark runs at tiny sizes and lands in
one JSON, and the missing GPU is stated as skipped with the reason."""

from experiments import bench_gpu


def test_device_counts():
  assert bench_gpu.device_counts(1) == [1]
  assert bench_gpu.device_counts(8) == [1, 2, 4, 8]
  assert bench_gpu.device_counts(6) == [1, 2, 4, 6]


def test_smoke_plan_covers_every_benchmark():
  plan = bench_gpu.plan(smoke=True, platform="cpu", visible=1)
  assert set(plan) == set(bench_gpu.BENCHMARKS)
  assert all(command[0] == f"experiments.bench_{name}" for name, (command, _) in plan.items())
  gpu = bench_gpu.plan(smoke=False, platform="gpu", visible=8)
  assert "--devices=1,2,4,8" in gpu["scaling"][0]


def test_bench_gpu_smoke(run_bench):
  # Two of the four benchmarks (each one's own smoke test runs the others): the wiring,
  # the one JSON, and what was skipped and why.
  final = run_bench("experiments.bench_gpu", "--smoke", "--only=input,trials")
  assert final["benchmark"] == "bench_gpu" and final["platform"] == "cpu"
  assert "no GPU visible" in final["skipped"]["gpu"]
  assert set(final["runs"]) == {"input", "trials"}
  for name, run in final["runs"].items():
    assert run["status"] == "done", (name, run.get("reason"), run.get("stderr_tail"))
    assert run["result"]["benchmark"] == f"bench_{name}"
  assert final["skipped"]["train"] == final["skipped"]["scaling"] == "not in --only"

"""Cost metrics of an architecture: params, FLOPs from XLA's cost analysis, latency when asked."""

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import costs as trial_costs


def _arch(**overrides):
  return arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                "model.mlp.depth": 1, "model.mlp.width": 16, **overrides})[0]


def test_flops_grow_with_the_model_and_latency_is_measured_only_when_asked(data):
  costs = trial_costs.TrialCosts(data.spec, data)
  arch, wider = _arch(), _arch(**{"model.mlp.depth": 2, "model.mlp.width": 64})
  lr = arch_lib.split_config({"model.name": "lr"})[0]
  flops = {a: costs.count_flops(a) for a in (lr, arch, wider)}
  # The MLP of `wider` alone: 2 * (F*D*64 + 64*64 + 64) multiply-adds per example.
  assert flops[wider] >= 2 * (data.spec.num_fields * 4 * 64 + 64 * 64 + 64)
  assert flops[lr] < flops[arch] < flops[wider]
  assert costs.count_params(arch) == arch_lib.count_params(arch, data.spec)
  assert set(costs.cost_metrics(arch)) == {"params", "flops"}  # latency only when asked
  costs.measure_latency = True
  metrics = costs.cost_metrics(arch)
  assert metrics["latency_ms"] > 0 and metrics["flops"] == flops[arch]
  assert costs.latency_ms(arch) == metrics["latency_ms"]  # cached

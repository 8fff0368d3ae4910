"""Latency of a candidate's serving forward (sfjax/cohorts/latency.py): the exported program,
timed at the configured batch size, cached per program; and its roofline estimate."""

import time

import jax
import numpy as np
import pytest
from flax import nnx

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import costs as trial_costs
from sfjax.cohorts import latency


def _arch(**overrides):
  return arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                "model.mlp.depth": 1, "model.mlp.width": 16, **overrides})[0]


def _shapes(spec):
  columns = len(spec.fields) if spec.layout is None else spec.layout.num_columns
  return columns, spec.num_dense, spec.layout is not None


def test_settings_name_the_bad_field():
  assert latency.LatencySettings() == latency.LatencySettings("measured", 512, 20)
  with pytest.raises(ValueError, match="study.latency_source"):
    latency.LatencySettings(source="guess")
  for field in ("batch_size", "repeats"):
    for bad in (0, -1, 2.5, True):
      with pytest.raises(ValueError, match=f"study.latency_{field}: expected an integer >= 1"):
        latency.LatencySettings(**{field: bad})


def test_the_exported_forward_computes_the_models_logits(data):
  arch = _arch()
  model = arch.build_model(data.spec, nnx.Rngs(0))
  columns, num_dense, weighted = _shapes(data.spec)
  exported = latency.export_forward(model, columns, arch.embedding_width, num_dense, weighted)
  # The bundle's signature: (leaves, emb [b, C, E], dense [b, Nd]) with b symbolic.
  emb_aval, dense_aval = exported.in_avals[-2:]
  assert emb_aval.shape[1:] == (columns, arch.embedding_width) and dense_aval.shape[1:] == (num_dense,)
  assert not isinstance(emb_aval.shape[0], int)
  for batch in (3, 64):
    args = latency.forward_inputs(model, exported, batch)
    logits = np.asarray(latency.compile_forward(exported, args)(*args))
    assert logits.shape == (batch,)
    np.testing.assert_allclose(logits, np.asarray(model(*args[1:])), rtol=1e-5, atol=1e-6)


def test_median_excludes_the_warm_up_call_and_outliers():
  delays = iter([0.3, 0.001, 0.001, 0.25, 0.001, 0.001])  # warm-up, then one slow call of 5

  def call():
    time.sleep(next(delays))
    return jax.numpy.zeros(())

  ms = latency.median_ms(call, (), repeats=5)
  assert 1.0 <= ms < 100.0


def test_one_program_is_timed_once_and_the_model_source_is_deterministic(data):
  columns, num_dense, weighted = _shapes(data.spec)
  small, big = _arch(), _arch(**{"model.mlp.depth": 3, "model.mlp.width": 128})
  timer = latency.ForwardLatency(latency.LatencySettings("model", batch_size=256))
  values = {}
  for a in (small, big, small):
    values[a] = timer(a.build_model(data.spec, nnx.Rngs(0)), columns, a.embedding_width, num_dense,
                      weighted)
  assert timer.programs_timed == 2  # the third call was the first program again
  again = latency.ForwardLatency(latency.LatencySettings("model", batch_size=256))
  assert again(small.build_model(data.spec, nnx.Rngs(1)), columns, small.embedding_width,
               num_dense, weighted) == values[small]  # other parameter values: same program
  assert 0 < values[small] < values[big]
  larger = latency.ForwardLatency(latency.LatencySettings("model", batch_size=2048))
  assert larger(big.build_model(data.spec, nnx.Rngs(0)), columns, big.embedding_width, num_dense,
                weighted) > values[big]


def test_trial_costs_measure_at_the_configured_batch_size(data):
  costs = trial_costs.TrialCosts(data.spec, data, measure_latency=True,
                                 latency=latency.LatencySettings(batch_size=1, repeats=3))
  big = _arch(**{"model.mlp.depth": 3, "model.mlp.width": 256})
  one = costs.latency_ms(big)
  assert costs.latency_ms(big) == one > 0  # cached per arch
  costs.set_latency_settings(latency.LatencySettings(batch_size=4096, repeats=3))
  many = costs.latency_ms(big)  # ~1.6 GFLOP a call against ~0.4 MFLOP: slower whatever the load
  assert many > one and costs.latency.batch_size == 4096
  # another row optimizer: another ArchSpec, the same serving program (timed once)
  other = _arch(**{"model.mlp.depth": 3, "model.mlp.width": 256, "embedding.optimizer": "sgd"})
  assert other != big and costs.latency_ms(other) == many
  assert costs._forward_latency.programs_timed == 1


def test_a_feature_layout_model_is_timed_with_its_weights(layout_data):
  costs = trial_costs.TrialCosts(layout_data.spec, layout_data, measure_latency=True,
                                 latency=latency.LatencySettings("model", batch_size=64))
  lr = arch_lib.split_config({"model.name": "lr"})[0]
  assert costs.cost_metrics(lr)["latency_ms"] > 0


def test_cost_dict_takes_a_dict_a_one_element_list_or_nothing():
  assert latency.cost_dict({"flops": 2.0}) == {"flops": 2.0}
  assert latency.cost_dict([{"flops": 3.0}]) == {"flops": 3.0}
  assert latency.cost_dict(None) == {} and latency.cost_dict([]) == {}

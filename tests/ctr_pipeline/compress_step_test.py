"""The `compress` step's block checks, checkpoint reading helpers and hand-off errors.

The whole step (train -> compress, reading a real checkpoint) runs in
tests/experiments/pipeline_ctr_compress_test.py.
"""

import ml_collections
import numpy as np
import pytest

from sfjax.automl.pipeline import StepContext, StepResult, StepSpec
from sfjax.checkpoint import reader
from sfjax.core.errors import ConfigError
from sfjax.ctr_pipeline import compress_step as psc
from tests.compress.prune_search_test import _setup as prune_setup
from tests.compress.prune_search_test import _Stop


def _block(**overrides):
  block = {"type": "compress", "population": 4, "finetune_steps": 5, "batch_size": 64,
           "generations": 1, "mutation_rate": 0.1, "dim_choices": (2, 4), "max_auc_drop": 0.01,
           "valid_rows": 0, "tune_table": False, "finetune_lr": 1e-3}
  block.update(overrides)
  return ml_collections.ConfigDict(block)


def test_a_good_block_passes_and_defaults_fill_in():
  psc._check_block(_block(), "steps.compress")
  minimal = ml_collections.ConfigDict({"type": "compress", "population": 2, "finetune_steps": 1,
                                       "batch_size": 8})
  psc._check_block(minimal, "steps.c")
  s = psc._settings(minimal)
  assert s["generations"] == 2 and s["dim_choices"] == () and s["tune_table"] is True


@pytest.mark.parametrize("key,value,message", [
    ("population", 1, "steps.compress.population: expected >= 2"),
    ("finetune_steps", 0, "steps.compress.finetune_steps: expected an int >= 1"),
    ("batch_size", 2.5, "steps.compress.batch_size: expected an int >= 1"),
    ("generations", -1, "steps.compress.generations: expected an int >= 0"),
    ("mutation_rate", 2.0, "steps.compress.mutation_rate: expected a number in"),
    ("finetune_lr", -1.0, "steps.compress.finetune_lr: expected a number in"),
    ("dim_choices", (0, 2), "steps.compress.dim_choices: expected a tuple of ints >= 1"),
    ("tune_table", 1, "steps.compress.tune_table: expected a bool"),
    ("valid_rows", -3, "steps.compress.valid_rows: expected an int >= 0"),
    ("bit_choices", (1, 32), "steps.compress.bit_choices: .* must be a non-empty subset"),
    ("bit_choices", "4", "steps.compress.bit_choices: expected a tuple of ints"),
])
def test_bad_fields_are_named(key, value, message):
  block = _block(**{key: value})
  with pytest.raises(ConfigError, match=message):
    psc._check_block(block, "steps.compress")


def test_an_unknown_field_is_named():
  with pytest.raises(ConfigError, match="steps.compress.populaton: unknown"):
    psc._check_block(_block(populaton=3), "steps.compress")


def test_a_missing_required_field_is_named():
  block = _block().to_dict()
  del block["population"]
  with pytest.raises(ConfigError, match="steps.compress.population: missing"):
    psc._check_block(ml_collections.ConfigDict(block), "steps.compress")


def test_orbax_state_unwraps_to_a_pure_dict():
  restored = {"mlp": {"hidden": {"0": {"kernel": {"value": np.ones((2, 3))}},
                                 "1": {"bias": {"value": np.zeros(3)}}}},
              "dense_linear": {"kernel": {"value": np.ones(2)}}}
  pure = reader.pure_params(restored)
  assert set(pure["mlp"]["hidden"]) == {0, 1}
  assert pure["mlp"]["hidden"][0]["kernel"].shape == (2, 3)
  assert pure["dense_linear"]["kernel"].shape == (2,)
  flat = psc._flat(pure)
  assert set(flat) == {"mlp/hidden/0/kernel", "mlp/hidden/1/bias", "dense_linear/kernel"}


def test_no_handed_on_checkpoint_is_a_named_error(tmp_path):
  spec = StepSpec(1, "compress", "compress", _block())
  train = StepResult("train", "baseline", "done", {}, {"checkpoint": None, "trainer_config": {}},
                     1.0)
  ctx = StepContext(spec, str(tmp_path), str(tmp_path), ml_collections.ConfigDict({"seed": 0}),
                    (train,))
  with pytest.raises(ConfigError, match=r"checkpoint \(output of an earlier step\): none"):
    psc._load_trained(ctx)


def test_compression_report_takes_the_last_done_compress_step():
  metrics = {"baseline_test_auc": 0.78, "final_test_auc": 0.775, "baseline_params": 100,
             "final_params": 40, "size_ratio": 0.4, "bits_ratio": 0.1, "front_size": 3}
  older = dict(metrics, final_test_auc=0.7)
  results = [StepResult("train", "baseline", "done", {"test_auc": 0.78}, {}, 1.0),
             StepResult("c1", "compress", "done", older, {}, 1.0),
             StepResult("c2", "compress", "done", metrics, {}, 1.0),
             StepResult("c3", "compress", "failed", {}, {}, 1.0, "boom")]
  report = psc.compression_report(results)["compression"]
  assert report == {k: metrics[k] for k in psc._COMPRESSION_REPORT_KEYS}
  assert psc.compression_report(results[:1]) == {"compression": None}


def test_the_search_compiles_with_the_trained_models_xla_cpu_dots(monkeypatch, tmp_path):
  dataset, _, graphdef, params, values, _, _ = prune_setup()
  for choice, options in (("eigen", {"xla_cpu_experimental_ynn_fusion_type": ""}), ("xla", {})):
    config = ml_collections.ConfigDict({
        "model": {"name": "deepfm", "embed_dim": 4, "mlp_dims": (8, 6)},
        "train": {"xla_cpu_dots": choice}})
    monkeypatch.setattr(psc, "_load_trained",
                        lambda ctx, c=config: (c, dataset, graphdef, params, values, "ckpt"))
    seen = []

    def search(*args, seen=seen, **kwargs):
      seen.append(kwargs["compiler_options"])
      raise _Stop

    monkeypatch.setattr(psc.ctr_compress, "search", search)
    ctx = StepContext(StepSpec(1, "compress", "compress", _block()), str(tmp_path),
                      str(tmp_path), ml_collections.ConfigDict({"seed": 0}), ())
    with pytest.raises(_Stop):
      psc._run_compress(ctx)
    assert seen == [options], choice

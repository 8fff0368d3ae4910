"""Tests of the CTR pipeline's training steps: the runner -> trainer config map, fully_train
on both embedding backends with resume, and the final-vs-baseline comparison."""

import json

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from search_spaces.ctr import GATES, SEARCH_SPACE
from sfjax import models
from sfjax.automl import pipeline
from sfjax.automl.pipeline import StepContext, StepResult, StepSpec
from sfjax.cohorts import arch as arch_lib
from sfjax.core import metrics
from sfjax.core.errors import ConfigError
from sfjax.ctr_pipeline import train_steps as pst
from sfjax.data import dataset as dataset_lib
from sfjax.data.types import DatasetSpec, FieldSpec
from sfjax.embedding.host_table import HostTable
from sfjax.models import generator
from sfjax.serving import Features, Predictor
from sfjax.train import defaults

# Layer sizes are the only derived trial keys (`depth` x `width` -> `model.<name>_dims`).
DERIVED = {f"model.{layers}.{size}" for layers in ("mlp", "cin", "bottom_mlp", "din_attention")
           for size in ("depth", "width")}


def _at(config, path):
  for part in path.split("."):
    config = config[part]
  return config


def test_every_trial_key_but_the_layer_sizes_is_a_trainer_config_path():
  base = defaults.ctr_defaults()
  for key in arch_lib.DYNAMIC_KEYS:  # and holds the trial's default
    assert arch_lib.DYNAMIC_DEFAULTS[key][0] == _at(base, key), key
  assert DERIVED <= set(arch_lib.STATIC_KEYS)
  for key in set(arch_lib.STATIC_KEYS) - DERIVED:
    _at(base, key)  # KeyError: not a trainer path


def test_a_bags_pooling_becomes_an_entry_of_data_pooling():
  """Issue #22: a trial's `features.<bag>.pooling` (a code) reaches the trainer as data.pooling."""
  arch, _ = arch_lib.split_config({"model.name": "fm"})
  recipe = defaults.ctr_defaults()
  recipe.data.pooling = "long0:sum,bag1:mean"
  config = pst.trainer_config(recipe, arch, {"features.bag1.pooling": 2.0,
                                             "features.bag0.pooling": 1.0})
  assert config.data.pooling == "long0:sum,bag1:sqrtn,bag0:mean"
  assert recipe.data.pooling == "long0:sum,bag1:mean"  # copied, not changed


def test_a_tables_dim_becomes_its_dim_in_data_tables():
  """Issue #22: a trial's `tables.<table>.dim` reaches the trainer in data.tables, beside the
  recipe's own settings of that table; a trial without one keeps the recipe's."""
  arch, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 8})
  recipe = defaults.ctr_defaults()
  recipe.data.tables = "item:optimizer=adagrad,dim=8"
  config = pst.trainer_config(recipe, arch, {"tables.item.dim": 4.0, "tables.user.dim": 0.0,
                                             "embedding.learning_rate": 0.1})
  assert config.data.tables == "item:optimizer=adagrad,dim=4; user:dim=0"
  assert config.embedding.learning_rate == 0.1
  assert recipe.data.tables == "item:optimizer=adagrad,dim=8"  # copied, not changed
  assert pst.trainer_config(recipe, arch, {}).data.tables == recipe.data.tables


def test_trainer_config_refuses_a_key_that_is_not_dynamic():
  arch, _ = arch_lib.split_config({})
  with pytest.raises(ValueError, match="'embedding.optimizer': is not a dynamic hyperparameter"):
    pst.trainer_config(defaults.ctr_defaults(), arch, {"embedding.optimizer": 1.0})


@pytest.mark.parametrize("point", [
    {"model.name": "dcnv2", "model.embed_dim": 4, "model.mlp.depth": 2, "model.mlp.width": 32,
     "model.cross_layers": 2, "model.cross_rank": 4, "embedding.optimizer": "adam",
     "embedding.learning_rate": 0.02, "embedding.use_l2": True, "embedding.l2": 1e-5,
     "embedding.init_stddev": 0.03, "optimizer.learning_rate": 0.002, "optimizer.use_weight_decay": False},
    {"model.name": "fm", "model.embed_dim": 8, "embedding.optimizer": "ftrl",
     "embedding.learning_rate": 0.1, "embedding.use_l2": False, "embedding.init_stddev": 0.01,
     "optimizer.learning_rate": 0.001, "optimizer.use_weight_decay": True, "optimizer.weight_decay": 1e-4},
])
def test_trainer_config_builds_the_trial_model_with_its_hyperparameters(point):
  arch, hparams = arch_lib.split_config(SEARCH_SPACE.runner_config(point))
  config = pst.trainer_config(defaults.ctr_defaults(), arch, hparams)
  assert config.model.name == arch.model_name and config.model.embed_dim == arch.embed_dim
  for key, value in point.items():  # a trial key applies by path (gates are search-only)
    if key not in DERIVED and key not in GATES:
      assert _at(config, key) == value, key
  assert config.embedding.l2 == point.get("embedding.l2", 0.0)
  assert config.optimizer.weight_decay == point.get("optimizer.weight_decay", 0.0)
  from_trainer = models.build_model_from_config(config.model, num_fields=5, num_dense=2,
                                                rngs=nnx.Rngs(0))
  from_trial = arch.build_model(_spec(5, 2), nnx.Rngs(0))
  def leaves(m):
    return sorted(x.shape for x in jax.tree.leaves(nnx.state(m)))

  assert leaves(from_trainer) == leaves(from_trial)


def test_a_din_trials_pooling_reaches_the_trainer_config():
  arch, hparams = arch_lib.split_config({"model.name": "din", "model.din_pooling": "mean",
                                         "model.din_attention.depth": 1,
                                         "model.din_attention.width": 8})
  config = pst.trainer_config(defaults.ctr_defaults(), arch, hparams)
  assert (config.model.name, config.model.din_pooling) == ("din", "mean")
  assert tuple(config.model.din_attention_dims) == (8,)
  arch, hparams = arch_lib.split_config({"model.name": "din"})
  assert pst.trainer_config(defaults.ctr_defaults(), arch, hparams).model.din_pooling == "sum"


def _spec(num_fields, num_dense):
  return DatasetSpec(tuple(FieldSpec(f"C{i}", 10) for i in range(num_fields)), num_dense)


def test_kept_pairs_make_the_composed_model_restricted_to_them():
  point = {"model.name": "deepfm", "model.embed_dim": 4, "model.mlp.depth": 1,
           "model.mlp.width": 8}
  arch, hparams = arch_lib.split_config(point)
  config = pst.trainer_config(defaults.ctr_defaults(), arch, hparams, kept_pairs=[[0, 2], [1, 3]])
  spec = json.loads(config.model.blocks)
  assert config.model.name == "composed" and config.model.embed_dim == 5  # 4 + first order
  fm = [b for b in spec["interactions"] if b["type"] == "fm"]
  assert fm and fm[0]["pairs"] == [[0, 2], [1, 3]]
  full = generator.named_model_spec("deepfm", 4, mlp_dims=(8,))
  assert generator.with_interaction_pairs(full, [(0, 2), (1, 3)]) == spec
  models.build_model_from_config(config.model, num_fields=4, num_dense=2, rngs=nnx.Rngs(0))


def _shared_config(backend="device"):
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = ml_collections.ConfigDict()
  c.task.data = d = defaults.ctr_defaults().data
  d.synthetic.num_train, d.synthetic.num_eval, d.synthetic.test_rows = 4096, 1024, 3000
  d.synthetic.cardinality_scale = 0.0003  # ~10k rows: a 70% cache holds 2 steps in flight
  c.steps = ml_collections.ConfigDict()
  c.steps.fully_train = ml_collections.ConfigDict({"type": "fully_train"})
  c.steps.fully_train.trainer = tr = defaults.ctr_defaults()
  tr.model.mlp_dims, tr.model.embed_dim = (16,), 4
  tr.train.steps, tr.train.batch_size, tr.train.eval_every, tr.train.eval_batch_size = 12, 128, 12, 1024
  tr.train.num_devices = 1
  tr.checkpoint.every_steps = 6
  tr.embedding.backend = backend
  tr.embedding.cache_rows = 0.7
  return c


def _ctx(tmp_path, config, name="fully_train", kind="fully_train", previous=()):
  step_dir = tmp_path / "steps" / f"0_{name}"
  step_dir.mkdir(parents=True, exist_ok=True)
  return StepContext(StepSpec(0, name, kind, config.steps[name]), str(step_dir), str(tmp_path),
                     config, tuple(previous))


def _counted_steps(monkeypatch, crash_at=None):
  """Steps run by each trainer the step builds from now on (its real step, wrapped to
  count); with `crash_at`, a trainer's `crash_at`-th step raises (a node lost mid-run)."""
  monkeypatch.undo()  # the real builder, not an earlier call's wrapper
  counts = []
  build = pst.loop.build_trainer

  def build_counting(config, spec):
    trainer = build(config, spec)
    counts.append(0)
    mine = len(counts) - 1

    def run_step(state, inputs):
      counts[mine] += 1
      if counts[mine] == crash_at:
        raise RuntimeError("node lost")
      return trainer.run_step(state, inputs)

    return trainer._replace(run_step=run_step)

  monkeypatch.setattr(pst.loop, "build_trainer", build_counting)
  return counts


def test_fully_train_on_both_backends_scores_the_test_split_alike(tmp_path, monkeypatch):
  kinds = pst.train_step_kinds({"ctr": SEARCH_SPACE})
  chosen = StepResult("nas", "nas", "done", {}, {"search_space": "ctr", "best_config": {
      "model.name": "fm", "model.embed_dim": 4, "embedding.learning_rate": 0.05}}, 1.0)
  out = {}
  steps = _counted_steps(monkeypatch)
  for backend in ("device", "cache"):
    config = _shared_config(backend)
    ctx = _ctx(tmp_path / backend, config, previous=[chosen])
    out[backend] = kinds["fully_train"].run(ctx)
    assert steps[-1] == 12  # a fresh directory: every step
    scores = np.load(tmp_path / backend / out[backend].output["test_scores"])
    labels = np.load(tmp_path / backend / out[backend].output["test_labels"])
    assert scores.shape == labels.shape == (3000,)
    assert out[backend].best_metrics["test_auc"] == pytest.approx(metrics.auc(labels, scores))
    # One eval at the end: the trainer's own test AUC is the saved scores' AUC.
    assert out[backend].output["final_metrics"]["test_auc"] == pytest.approx(
        out[backend].best_metrics["test_auc"], abs=1e-6)
    assert out[backend].output["checkpoint"].endswith("step_00000012")
    assert out[backend].best_metrics["model"] == "fm"
    _assert_bundle_scores_the_test_split(tmp_path / backend, out[backend], scores)
  assert out["cache"].best_metrics["test_auc"] == pytest.approx(
      out["device"].best_metrics["test_auc"], abs=1e-5)
  # Killed after the checkpoint of step 6: the rerun resumes there, trains steps 7..12
  # only (a fresh start would train 12, as above) and ends as the uninterrupted run.
  _counted_steps(monkeypatch, crash_at=9)
  with pytest.raises(RuntimeError, match="node lost"):
    kinds["fully_train"].run(_ctx(tmp_path / "killed", _shared_config(), previous=[chosen]))
  steps = _counted_steps(monkeypatch)
  resumed = kinds["fully_train"].run(_ctx(tmp_path / "killed", _shared_config(),
                                          previous=[chosen]))
  assert steps == [6] and resumed.best_metrics == out["device"].best_metrics
  # Rerun on the finished directory: nothing left to train, same result.
  again = kinds["fully_train"].run(_ctx(tmp_path / "device", _shared_config(), previous=[chosen]))
  assert steps == [6, 0] and again.best_metrics == out["device"].best_metrics


def _assert_bundle_scores_the_test_split(root, out, scores):
  """fully_train's serving bundle gives the step's saved test logits (the final model)."""
  predictor = Predictor.load(str(root / out.output["serving_bundle"]), batch_sizes=(512,))
  trained = ml_collections.ConfigDict(out.output["trainer_config"])
  data = dataset_lib.make_dataset(trained.data, trained.seed)
  logits = [predictor.logits_features(Features(b.ids[b.mask > 0], b.dense[b.mask > 0]))
            for b in data.eval_batches("test", 512)]
  np.testing.assert_allclose(np.concatenate(logits), scores, rtol=1e-5, atol=1e-6)


_CHOSEN = StepResult("nas", "nas", "done", {}, {"search_space": "ctr", "best_config": {
    "model.name": "fm", "model.embed_dim": 4, "embedding.learning_rate": 0.05}}, 1.0)


def _host_config(host_storage):
  """The cache backend on `host_storage`, and a baseline step borrowing fully_train's recipe."""
  c = _shared_config("cache")
  c.steps.fully_train.trainer.embedding.host_storage = host_storage
  c.steps.base = ml_collections.ConfigDict({"type": "baseline", "recipe_step": "fully_train"})
  return c


def _scores(root, result):
  return np.load(root / result.output["test_scores"])


# Both storages are slow (about 19 s each); the fast tier keeps resume-identical through
# tests/train (DESIGN §6), and tests/faults/pipeline_faults_test.py kills the pipeline CLI.
@pytest.mark.parametrize("host_storage", [pytest.param("mmap", marks=pytest.mark.slow),
                                          pytest.param("ram", marks=pytest.mark.slow)])
def test_training_steps_rerun_after_a_crash_on_either_host_storage(tmp_path, monkeypatch,
                                                                    host_storage):
  kinds = pst.train_step_kinds({"ctr": SEARCH_SPACE})

  def run(root, name="fully_train", kind="fully_train"):
    return kinds[kind].run(_ctx(root, _host_config(host_storage), name, kind, previous=[_CHOSEN]))

  ref, run_dir = tmp_path / "ref", tmp_path / "run"
  want = {"fully_train": run(ref), "base": run(ref, "base", "baseline")}
  for name, kind, crashes in (("fully_train", "fully_train", (3, 9)), ("base", "baseline", (9,))):
    # Killed before its first checkpoint (step 6), then after it: the first rerun starts
    # afresh, the second resumes at step 6; both over the table the crash left behind.
    for crash_at in crashes:
      _counted_steps(monkeypatch, crash_at=crash_at)
      with pytest.raises(RuntimeError, match="node lost"):
        run(run_dir, name, kind)
    steps = _counted_steps(monkeypatch)
    got = run(run_dir, name, kind)
    assert steps == [6] and got.best_metrics == want[name].best_metrics, name
    np.testing.assert_array_equal(_scores(run_dir, got), _scores(ref, want[name]))
    host_path = got.output["trainer_config"]["embedding"]["host_path"]
    if host_storage == "mmap":  # each step's table in its own directory, as the reference's
      assert host_path == str(run_dir / "steps" / f"0_{name}" / pst.HOST_TABLE_DIR)
      ref_path = want[name].output["trainer_config"]["embedding"]["host_path"]
      for got_part, want_part in zip(HostTable.open_mmap(host_path, writable=False).read_all(),
                                     HostTable.open_mmap(ref_path, writable=False).read_all(),
                                     strict=True):
        np.testing.assert_array_equal(got_part, want_part)  # values [V, E], slots [V, S]
    else:
      assert host_path == ""
  assert want["base"].best_metrics["model"] == "deepfm"


def test_a_step_keeps_its_own_host_path_and_never_borrows_another_steps(tmp_path):
  config = _host_config("mmap")
  config.steps.fully_train.trainer.embedding.host_path = str(tmp_path / "given")
  own = _ctx(tmp_path, config)
  assert pst.step_host_path(own) == str(tmp_path / "given")
  base = _ctx(tmp_path, config, "base", "baseline")  # borrows the recipe, not the table
  assert pst.step_host_path(base) == str(tmp_path / "steps" / "0_base" / pst.HOST_TABLE_DIR)
  config.steps.base.trainer = {"embedding": {"host_path": str(tmp_path / "b")}}
  assert pst.step_host_path(_ctx(tmp_path, config, "base", "baseline")) == str(tmp_path / "b")
  # The check accepts mmap storage without a path (the step's directory is the default).
  pst._check_recipe(_host_config("mmap").steps.fully_train, "steps.fully_train")
  # A default path that holds something else is never deleted.
  (tmp_path / "steps" / "0_fully_train" / pst.HOST_TABLE_DIR).mkdir()
  (tmp_path / "steps" / "0_fully_train" / pst.HOST_TABLE_DIR / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="not a host table directory"):
    pst._place_host_table(_ctx(tmp_path, _host_config("mmap")),
                          _host_config("mmap").steps.fully_train.trainer)
  assert (tmp_path / "steps" / "0_fully_train" / pst.HOST_TABLE_DIR / "notes.txt").exists()


def test_baseline_trains_the_recipe_default_and_needs_a_test_split(tmp_path):
  kinds = pst.train_step_kinds({"ctr": SEARCH_SPACE})
  config = _shared_config()
  config.steps.base = ml_collections.ConfigDict({"type": "baseline", "recipe_step": "fully_train"})
  result = kinds["baseline"].run(_ctx(tmp_path, config, "base", "baseline"))
  assert result.best_metrics["model"] == "deepfm" and result.output["role"] == "baseline"
  config.task.data.synthetic.test_rows = 0
  with pytest.raises(ConfigError, match="'test' split"):
    kinds["baseline"].run(_ctx(tmp_path / "other", config, "base", "baseline"))
  config.steps.base.recipe_step = "nowhere"
  with pytest.raises(ConfigError, match="steps.nowhere.trainer: missing"):
    kinds["baseline"].run(_ctx(tmp_path / "third", config, "base", "baseline"))


def test_recipe_check_names_the_field():
  block = _shared_config().steps.fully_train
  pst._check_recipe(block, "steps.fully_train")
  block.trainer.checkpoint.every_steps = 0
  with pytest.raises(ConfigError, match="steps.fully_train.trainer.checkpoint.every_steps"):
    pst._check_recipe(block, "steps.fully_train")
  block.trainer.train.steps = -1
  with pytest.raises(ConfigError, match="config field steps.fully_train.trainer.train.steps"):
    pst._check_recipe(block, "steps.fully_train")
  with pytest.raises(ConfigError, match="steps.x.trainer: missing"):
    pst._check_recipe(ml_collections.ConfigDict({"type": "fully_train"}), "steps.x")


def test_compare_final_to_baseline(tmp_path):
  rng = np.random.default_rng(0)
  labels = (rng.random(5000) < 0.3).astype(np.float32)
  files = {}
  for name, noise in (("final", 1.0), ("base", 2.0)):
    np.save(tmp_path / f"{name}_s.npy", labels + noise * rng.normal(size=5000))
    np.save(tmp_path / f"{name}_l.npy", labels)
    files[name] = {"test_scores": f"{name}_s.npy", "test_labels": f"{name}_l.npy"}
  def auc(n):
    return metrics.auc(labels, np.load(tmp_path / f"{n}_s.npy"))

  results = [StepResult("ft", "fully_train", "done", {"test_auc": auc("final")}, files["final"], 1.0),
             StepResult("b", "baseline", "done", {"test_auc": auc("base")}, files["base"], 1.0)]
  out = pst.compare_final_to_baseline(results, str(tmp_path), num_resamples=100)
  assert out["final_test_auc"] == auc("final") and out["baseline_test_auc"] == auc("base")
  interval = out["test_auc_interval"]
  assert interval["diff"] == pytest.approx(auc("final") - auc("base"))
  assert 0 < interval["low"] < interval["diff"] < interval["high"] and out["beats_baseline"]
  final = out["final_test_auc_interval"]  # the final model's own AUC interval
  assert final["auc"] == pytest.approx(auc("final"))
  assert final["low"] < auc("final") < final["high"] and final["num_examples"] == 5000
  missing = pst.compare_final_to_baseline(results[:1], str(tmp_path), num_resamples=100)
  assert missing["baseline_test_auc"] is None and missing["test_auc_interval"] is None
  assert missing["final_test_auc_interval"] == pytest.approx(final)  # the same row draws
  assert pst.compare_final_to_baseline([], str(tmp_path))["final_test_auc_interval"] is None
  np.save(tmp_path / "base_l.npy", labels[::-1])
  with pytest.raises(ValueError, match="different test rows"):
    pst.compare_final_to_baseline(results, str(tmp_path))


def test_auc_interval_matches_resampled_aucs_by_hand():
  rng = np.random.default_rng(1)
  labels = (rng.random(600) < 0.4).astype(np.float32)
  scores = labels + rng.normal(size=600)
  out = pst.auc_interval(labels, scores, num_resamples=50, seed=4)
  draws = np.random.default_rng(4)  # the bootstrap's own row draws, redone with metrics.auc
  aucs = [metrics.auc(labels[i], scores[i]) for i in
          (draws.integers(0, 600, 600) for _ in range(50))]
  assert out["auc"] == pytest.approx(metrics.auc(labels, scores))
  assert out["low"] == pytest.approx(np.percentile(aucs, 2.5))
  assert out["high"] == pytest.approx(np.percentile(aucs, 97.5))
  assert out["stderr"] == pytest.approx(np.std(aucs, ddof=1))
  assert out["num_resamples"] == 50 and out["confidence"] == 0.95


def test_training_steps_take_overrides_of_the_librarys_recipe():
  kinds = pst.train_step_kinds({"ctr": SEARCH_SPACE})
  recipe = pst.recipe_defaults()
  pst._check_recipe(pst._fully_train_defaults(), "steps.fully_train")  # the defaults are valid
  assert recipe.checkpoint.every_steps > 0 and recipe.train.eval_every == recipe.train.steps
  assert pst._baseline_defaults().recipe_step == "fully_train"
  config = ml_collections.ConfigDict({"pipeline": {"order": "own,fully_train"}, "steps": {
      "fully_train": {"type": "fully_train", "trainer": {"train": {"steps": 120}}},
      "own": {"type": "baseline", "recipe_step": "own", "trainer": {"model": {"embed_dim": 8}}}}})
  blocks = pipeline.effective_blocks(config, kinds)
  assert blocks["fully_train"].trainer.train.steps == 120
  assert blocks["fully_train"].trainer.train.batch_size == recipe.train.batch_size
  assert blocks["own"].trainer.model.embed_dim == 8 and blocks["own"].trainer.model.name == "deepfm"
  config.steps.own.trainer.checkpoint = {"every_steps": 0}  # a baseline with its own recipe: checked
  with pytest.raises(ConfigError, match=r"steps\.own\.trainer\.checkpoint\.every_steps: must be > 0"):
    pipeline.parse_steps(config, kinds)
  config.steps.own.trainer.checkpoint.every_steps = 10
  config.steps.fully_train.trainer.train.stepz = 3
  with pytest.raises(ConfigError, match=r"steps\.fully_train\.trainer\.train\.stepz: unknown "
                                        r"setting of step 'fully_train' \(fully_train\); did you "
                                        r"mean steps\.fully_train\.trainer\.train\.steps\?"):
    pipeline.parse_steps(config, kinds)


def test_a_din_trial_reaches_the_trainer_with_its_activation_unit():
  arch, _ = arch_lib.split_config({"model.name": "din", "model.din_attention.depth": 2,
                                   "model.din_attention.width": 16})
  config = pst.trainer_config(defaults.ctr_defaults(), arch, {})
  assert config.model.name == "din" and tuple(config.model.din_attention_dims) == (16, 16)

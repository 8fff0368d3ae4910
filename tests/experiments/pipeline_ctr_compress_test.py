"""The smoke train -> compress pipeline end to end through `python -m experiments.pipeline`.

Checks the report (the trained model's test AUC read back through its checkpoint
equals what the train step scored), the Pareto front, the saved physically
pruned model (its shapes are the compressed `model.*` block's, its size the pick's),
and its serving bundle (the step's `serving_bundle`: its int8 table as stored, scores on
the test split equal to the pruned model's logits, its test AUC the step's).
"""

import json
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from experiments.configs import pipeline_ctr_compress
from search_spaces import blocks, ctr
from sfjax.automl.pipeline import parse_steps
from sfjax.compress import quant
from sfjax.core import metrics
from sfjax.core.errors import ConfigError
from sfjax.ctr_pipeline import steps as pipeline_steps
from sfjax.data import dataset as dataset_lib
from sfjax.models import registry
from sfjax.serving import Features, Predictor
from tests.serving.bundle_test import AUC_TOL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _kinds():
  return pipeline_steps.ctr_step_kinds({"ctr": ctr.SEARCH_SPACE,
                                        "blocks": blocks.BLOCK_SEARCH_SPACE})


def test_smoke_train_then_compress(tmp_path):
  workdir = str(tmp_path / "pipe")
  r = subprocess.run([sys.executable, "-m", "experiments.pipeline",
                      "--config=experiments/configs/pipeline_ctr_compress.py:smoke",
                      f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True,
                     timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""))
  assert r.returncode == 0, r.stderr[-3000:]
  report = json.loads(r.stdout.strip().splitlines()[-1])
  assert report["status"] == "done"
  train, comp = report["steps"]
  assert (train["type"], comp["type"]) == ("baseline", "compress")
  m = comp["best_metrics"]
  # The checkpoint read back scores the same test rows as the train step did.
  assert abs(m["baseline_test_auc"] - train["best_metrics"]["test_auc"]) < 1e-5
  assert abs(m["baseline_test_auc"] - report["baseline_test_auc"]) < 1e-5
  assert report["compression"] == {k: m[k] for k in (
      "baseline_test_auc", "final_test_auc", "baseline_params", "final_params", "size_ratio",
      "bits_ratio")}  # the report's top level carries the pick against its source
  # The pick re-tuned alone and physically pruned scores as its masked self in the search.
  assert abs(m["final_test_auc"] - m["search_test_auc"]) < 1e-3
  assert m["final_params"] <= m["baseline_params"] and m["final_bits"] < m["baseline_bits"]
  assert abs(m["size_ratio"] - m["final_params"] / m["baseline_params"]) < 1e-12
  assert abs(m["bits_ratio"] - m["final_bits"] / m["baseline_bits"]) < 1e-12
  assert m["baseline_bits"] == 32 * m["baseline_params"] and m["final_table_bits"] in (4, 8, 32)
  assert 0.6 < m["final_test_auc"] < 1

  with open(os.path.join(workdir, "steps", "1_compress", "output.json")) as f:
    out = json.load(f)
  front = out["pareto_front"]
  assert len(front) == m["front_size"] >= 1
  sizes, aucs = [p["bits"] for p in front], [p["valid_auc"] for p in front]
  assert sizes == sorted(sizes) and aucs == sorted(aucs)  # smaller is worse along a front
  pick = out["compressed_model"]
  assert pick["name"] == "deepfm" and pick["embed_dim"] == m["final_embed_dim"]
  assert ",".join(map(str, pick["mlp_dims"])) == m["final_mlp_dims"]
  assert any(p["bits"] == m["final_bits"] and p["embed_dim"] == pick["embed_dim"]
             and p["table_bits"] == m["final_table_bits"] for p in front)

  # The saved pruned model has exactly the compressed block's shapes and the pick's size.
  saved = np.load(os.path.join(workdir, out["pruned_model"]))
  table = {k: saved[k] for k in ("values", "codes", "scales") if k in saved.files}
  if m["final_table_bits"] == 32:
    assert set(table) == {"values"}
    num_rows, width = table["values"].shape
  else:  # int8 codes and one float32 scale per row
    assert set(table) == {"codes", "scales"} and table["codes"].dtype == np.int8
    num_rows, width = table["codes"].shape
    assert table["scales"].shape == (num_rows,)
  assert width == registry.embedding_width("deepfm", pick["embed_dim"])
  cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in pick.items()}
  abstract = nnx.eval_shape(lambda: registry.build_model_from_config(
      cfg, num_fields=26, num_dense=13, rngs=nnx.Rngs(0)))
  shapes = {k.removeprefix("params/"): saved[k].shape for k in saved.files if k not in table}
  leaves = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(abstract)))[0]
  expected = {"/".join(str(getattr(p, "key", p)) for p in path): leaf.shape
              for path, leaf in leaves}
  assert shapes == expected
  assert num_rows * width + sum(int(np.prod(s)) for s in shapes.values()) == m["final_params"]
  _assert_the_bundle_serves_the_pruned_model(workdir, out, saved, m, abstract)


def _assert_the_bundle_serves_the_pruned_model(workdir, out, saved, m, abstract):
  """The step's bundle: its table stored as the pruned model's (int8 codes at 4 or 8 bits);
  its scores on the test split equal the pruned model's logits (1e-6), so its test AUC is
  the step's `final_test_auc`, within the int8 tolerance of the fp32 trained model or above."""
  bundle = os.path.join(workdir, out["serving_bundle"])
  assert out["serving_bundle"] == os.path.join("steps", "1_compress", "bundle")
  predictor = Predictor.load(bundle, batch_sizes=(512,), rows="mmap")
  table = predictor.manifest["tables"][0]
  assert table["dtype"] == ("float32" if m["final_table_bits"] == 32 else "int8")
  assert predictor.manifest["model_config"]["embed_dim"] == m["final_embed_dim"]
  with open(os.path.join(workdir, "steps", "0_train", "output.json")) as f:
    trained = ml_collections.ConfigDict(json.load(f)["trainer_config"])
  data = dataset_lib.make_dataset(trained.data, trained.seed)
  ids, dense, labels = (np.concatenate(x) for x in zip(*(
      (b.ids[b.mask > 0], b.dense[b.mask > 0], b.labels[b.mask > 0])
      for b in data.eval_batches("test", 512)), strict=True))
  served = predictor.logits_features(Features(ids, dense))
  values = (saved["values"] if "values" in saved.files else
            np.asarray(quant.dequantize(saved["codes"], saved["scales"])))
  params = {}
  for key in saved.files:
    if key.startswith("params/"):
      node, parts = params, [int(p) if p.isdigit() else p for p in key.split("/")[1:]]
      for part in parts[:-1]:
        node = node.setdefault(part, {})
      node[parts[-1]] = saved[key]
  graphdef, _ = nnx.split(abstract)
  # The pruned model through the model code, compiled for the predictor's batch of 512
  # (the rows padded to it), so both run the same float arithmetic.
  forward = jax.jit(lambda p, emb, x: nnx.merge(graphdef, p)(emb, x))
  n, emb = len(ids), values[ids + np.asarray(data.spec.field_offsets)]
  pad = -n % 512
  emb, x = np.pad(emb, ((0, pad), (0, 0), (0, 0))), np.pad(dense, ((0, pad), (0, 0)))
  want = np.concatenate([forward(params, emb[i:i + 512], x[i:i + 512])
                         for i in range(0, n + pad, 512)])[:n]
  np.testing.assert_allclose(served, want, rtol=1e-6, atol=1e-6)
  auc = metrics.auc(labels, served)
  assert auc == pytest.approx(m["final_test_auc"], abs=1e-6)
  assert auc >= m["baseline_test_auc"] - AUC_TOL["int8"]


def test_config_variants_pass_every_step_check():
  for variant in ("", "smoke"):
    config = pipeline_ctr_compress.get_config(variant)
    assert [(s.name, s.kind) for s in parse_steps(config, _kinds())] == [
        ("train", "baseline"), ("compress", "compress")]
  config = pipeline_ctr_compress.get_config("smoke")
  config.steps.compress.population = 1
  with pytest.raises(ConfigError, match="steps.compress.population: expected >= 2"):
    parse_steps(config, _kinds())
  with pytest.raises(ValueError, match="unknown config variant"):
    pipeline_ctr_compress.get_config("tiny")

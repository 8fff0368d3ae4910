"""`write_bundle`: a Criteo run's bundle scores raw lines as the trainer evaluated them,
records what serving needs, loads in a fresh interpreter without the model code, and
serves fp16 / int8 tables within their stated tolerance."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sfjax.checkpoint import reader
from sfjax.core import metrics as metrics_lib
from sfjax.serving import Predictor, write_bundle
from sfjax.serving import manifest as manifest_lib
from tests.serving import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Stated tolerances (measured on this run: see test_fp16_and_int8_tables_serve_within_tolerance).
AUC_TOL = {"float16": 1e-4, "int8": 2e-3}


@pytest.fixture(scope="module")
def criteo_run(tmp_path_factory):
  """(run, bundle, eval lines, trainer eval (logits, ids, dense, labels)) of a tiny DeepFM
  trained on Criteo-format text hashed into 500 rows per field."""
  root = tmp_path_factory.mktemp("criteo")
  c = tiny_runs.tiny_config()
  c.data.hash_rows = 500
  run = tiny_runs.train_run(root, c, criteo=True)
  bundle = str(root / "bundle")
  write_bundle(run.workdir, bundle)
  with open(root / "eval.tsv") as f:
    lines = [line.rstrip("\n") for line in f]
  return run, bundle, lines, tiny_runs.trainer_logits(run)


def test_raw_lines_score_as_the_trainer_evaluated_them(criteo_run):
  run, bundle, lines, (logits, _, _, labels) = criteo_run
  p = Predictor.load(bundle, batch_sizes=(64, 512))
  np.testing.assert_allclose(p.logits_features(p.parse_records(lines)), logits,
                             rtol=1e-6, atol=1e-6)
  m = p.manifest
  assert (m["format"], m["model"], m["record_format"]) == (manifest_lib.FORMAT_NAME, "deepfm",
                                                          "criteo")
  assert m["metrics"]["auc"] == pytest.approx(run.metrics["auc"])
  assert metrics_lib.auc(labels, p.predict(lines)) == pytest.approx(run.metrics["auc"], abs=1e-6)
  assert [f["name"] for f in m["features"]] == [f"C{i}" for i in range(1, 27)]
  assert {f["kind"] for f in m["features"]} == {"one_hot"} and m["mapping"]["hash_rows"] == 500
  assert m["features"][1]["offset"] == 500 and m["tables"][0]["rows"] == 26 * 500
  assert m["forward"]["inputs"]["emb"] == ["B", 26, 17]
  listed = {e["file"] for e in m["files"]}
  on_disk = {os.path.relpath(os.path.join(d, f), bundle) for d, _, fs in os.walk(bundle)
             for f in fs} - {"manifest.json"}
  assert listed == on_disk


def test_the_writer_refuses_a_used_directory_and_an_unknown_dtype(criteo_run, tmp_path):
  run, bundle, _, _ = criteo_run
  with pytest.raises(FileExistsError, match="exists and is not empty"):
    write_bundle(run.workdir, bundle)
  with pytest.raises(ValueError, match="--dtype: must be one of float32, float16, int8"):
    write_bundle(run.workdir, str(tmp_path / "b"), dtype="bfloat16")


@pytest.mark.parametrize("dtype", ["int8", pytest.param("float16", marks=pytest.mark.slow)])
def test_fp16_and_int8_tables_serve_within_tolerance(dtype, criteo_run, tmp_path):
  run, _, lines, (logits, _, _, labels) = criteo_run
  out = str(tmp_path / dtype)
  write_bundle(run.workdir, out, dtype=dtype)
  p = Predictor.load(out, batch_sizes=(512,), rows="mmap")
  got = p.logits_features(p.parse_records(lines))
  assert not np.array_equal(got, logits)  # the table really is stored at lower precision
  assert abs(metrics_lib.auc(labels, got) - metrics_lib.auc(labels, logits)) <= AUC_TOL[dtype]
  table = np.load(os.path.join(out, p.manifest["tables"][0]["chunks"][0]["values"]))
  assert table.dtype == np.dtype(dtype)


def test_a_fresh_interpreter_predicts_without_the_model_code(criteo_run):
  _, bundle, lines, (logits, _, _, _) = criteo_run
  code = (
      "import json, sys\n"
      "import numpy as np\n"
      "from sfjax.serving import Predictor\n"
      f"p = Predictor.load({bundle!r}, batch_sizes=(8,))\n"
      f"lines = json.loads({json.dumps(json.dumps(lines[:5]))})\n"
      "logits = p.logits_features(p.parse_records(lines))\n"
      "bad = sorted(m for m in sys.modules if m.startswith(('sfjax.models', 'sfjax.train', "
      "'flax', 'optax', 'orbax')))\n"
      "print(json.dumps({'logits': logits.tolist(), 'bad': bad}))\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=240)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["bad"] == []
  np.testing.assert_allclose(out["logits"], logits[:5], rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # builds and prunes a model (the compression step's own code)
def test_the_compression_steps_int8_model_serves_through_the_same_path(criteo_run, tmp_path):
  from flax import nnx  # the reference pruned model is built with the model code

  from sfjax.checkpoint import open_checkpoint
  from sfjax.compress import prune as ctr_prune
  from sfjax.ctr_pipeline import compress_step
  run, _, lines, (_, ids, dense, _) = criteo_run
  ckpt = open_checkpoint(run.workdir)
  values = np.concatenate([v for _, v, _ in ckpt.table.chunks()])
  spec = ctr_prune.make_spec(run.config.model, 26, 13, None, (8, 32))
  genome = ctr_prune.full_genome(spec)
  genome[:5], genome[-2:] = 0, (12, 8)  # 5 units of the first layer dropped, k = 12, 8 bits
  pruned = ctr_prune.prune(spec, ckpt.params, values, genome)
  npz = str(tmp_path / "pruned_model.npz")
  compress_step._save_pruned(npz, pruned)  # noqa: SLF001 (the step's own file format)
  # A killed earlier run's leftovers (a bundle, a half-written one) are replaced.
  os.makedirs(tmp_path / "bundle")
  (tmp_path / "bundle" / "manifest.json").write_text("{}")
  os.makedirs(tmp_path / "bundle.tmp")
  out = compress_step.write_serving_bundle(str(tmp_path), npz, pruned.model_cfg,
                                           run.config.to_dict(), ckpt.path)
  assert out == str(tmp_path / "bundle") and not os.path.exists(tmp_path / "bundle.tmp")
  p = Predictor.load(out, batch_sizes=(512,))
  m = p.manifest
  assert m["tables"][0]["dtype"] == "int8" and m["tables"][0]["dim"] == 13
  assert m["model_config"]["mlp_dims"] == [27, 16] and m["pruned_model"] == npz
  for chunk in m["tables"][0]["chunks"]:  # the step's codes and scales, as stored
    lo, hi = chunk["rows"]
    np.testing.assert_array_equal(np.load(os.path.join(out, chunk["values"])),
                                  pruned.codes[lo:hi])
    np.testing.assert_array_equal(np.load(os.path.join(out, chunk["scales"])),
                                  pruned.scales[lo:hi])
  offsets = np.arange(26) * 500
  want = nnx.merge(pruned.graphdef, pruned.params)(np.asarray(pruned.values)[ids + offsets], dense)
  np.testing.assert_allclose(p.logits_features(p.parse_records(lines)), want, rtol=1e-6, atol=1e-6)


def test_a_zero_size_leaf_restored_as_none_takes_the_models_own():
  """Orbax restores a zero-size array (the dense kernel of a model without dense features)
  as None; the bundle writer keeps the model's own empty leaf, nothing else."""
  empty, kernel = np.zeros((0,), np.float32), np.ones((3,), np.float32)
  restored = {"bias": np.float32(0.5), "dense_linear": {"kernel": None}, "mlp": {"w": None}}
  model = {"bias": np.float32(0.0), "dense_linear": {"kernel": empty}, "mlp": {"w": kernel}}
  out = reader.with_empty_leaves(restored, model)
  assert out["bias"] == 0.5 and out["dense_linear"]["kernel"].shape == empty.shape
  assert out["mlp"]["w"] is None  # a missing non-empty leaf stays missing (the load fails)

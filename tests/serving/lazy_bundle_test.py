"""A cache-backend run on an mmap host table exports a lazy bundle (written rows + the init
rule) that scores exactly as the trainer evaluated, refuses tampering by file name, and
serves a 10^9-row table in a few GiB of RAM."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from sfjax.checkpoint import open_checkpoint
from sfjax.serving import BundleError, Features, Predictor, write_bundle
from tests.serving import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = {"rtol": 1e-6, "atol": 1e-6}  # as predictor_test: fp32 tables, the trainer's forward


@pytest.fixture(scope="module")
def lazy_run(tmp_path_factory):
  """(run, lazy bundle) of a tiny DeepFM trained on the cache backend over an mmap host table."""
  root = tmp_path_factory.mktemp("lazy")
  c = tiny_runs.tiny_config(backend="cache")
  c.embedding.host_storage, c.embedding.host_path = "mmap", str(root / "host")
  run = tiny_runs.train_run(root, c)
  bundle = str(root / "bundle")
  write_bundle(run.workdir, bundle)  # auto: an mmap host table gives a lazy table
  return run, bundle


@pytest.mark.slow  # trains a cache-backend run (~10 s)
def test_lazy_bundle_scores_written_and_unwritten_rows_as_the_trainer(lazy_run):
  run, bundle = lazy_run
  logits, ids, dense, _ = tiny_runs.trainer_logits(run)
  predictor = Predictor.load(bundle, batch_sizes=(64, 512))
  table = predictor.manifest["tables"][0]
  assert table["storage"] == "lazy" and predictor.manifest["version"] == 2
  written = np.load(os.path.join(bundle, table["written"]["ids"]))
  assert 0 < written.size == table["written"]["rows"] < table["rows"] // 2
  rows = (ids + predictor.offsets[None, :]).reshape(-1)
  assert np.isin(rows, written).any() and (~np.isin(rows, written)).any()  # both kinds
  ckpt = open_checkpoint(run.workdir)
  np.testing.assert_array_equal(predictor.rows.gather(rows[:2000]), ckpt.table.rows(rows[:2000])[0])
  for mode in ("memory", "mmap", "cache"):
    p = Predictor.load(bundle, batch_sizes=(512,), rows=mode)
    np.testing.assert_allclose(p.logits_features(Features(ids, dense)), logits, **TOL,
                               err_msg=mode)
  stored = sum(e["bytes"] for e in predictor.manifest["files"] if e["file"].startswith("table/"))
  assert stored < table["rows"] * table["dim"] * 4 // 2  # only the written rows are stored
  dense_bundle = os.path.join(os.path.dirname(bundle), "dense_bundle")
  m = write_bundle(run.workdir, dense_bundle, table_storage="dense")
  assert m["tables"][0]["storage"] == "dense" and m["version"] == 1
  np.testing.assert_allclose(Predictor.load(dense_bundle, batch_sizes=(512,)).logits_features(
      Features(ids, dense)), logits, **TOL)


@pytest.mark.slow  # shares the cache-backend run
def test_a_tampered_lazy_bundle_fails_naming_the_file(lazy_run, tmp_path):
  _, bundle = lazy_run
  for rel in ("table/written_ids.npy", "table/written_000000000000.npy"):
    copy = str(tmp_path / rel.replace("/", "_"))
    shutil.copytree(bundle, copy)
    target = os.path.join(copy, rel)
    with open(target, "r+b") as f:
      f.seek(-3, os.SEEK_END)
      byte = f.read(1)
      f.seek(-3, os.SEEK_END)
      f.write(bytes([byte[0] ^ 4]))
    with pytest.raises(BundleError, match=f"{target}: bundle file is corrupt"):
      Predictor.load(copy, batch_sizes=(8,))


@pytest.mark.slow  # trains a device-backend run
def test_lazy_needs_a_host_table_checkpoint_and_a_known_storage(tmp_path):
  run = tiny_runs.train_run(tmp_path)  # device backend: every row is in the checkpoint
  with pytest.raises(ValueError, match="--table_storage=lazy needs a cache-backend checkpoint"):
    write_bundle(run.workdir, str(tmp_path / "b"), table_storage="lazy")
  with pytest.raises(ValueError, match="--table_storage: must be one of auto, dense, lazy"):
    write_bundle(run.workdir, str(tmp_path / "b"), table_storage="sparse")
  m = write_bundle(run.workdir, str(tmp_path / "b"))  # auto: the device backend stays dense
  assert m["tables"][0]["storage"] == "dense"


def _as_billion_rows(bundle: str, out: str) -> int:
  """A copy of the lazy bundle whose 26 fields hold ~10^9 rows: the same written rows and
  files (digests unchanged), the fields' row counts raised in the manifest. Returns V."""
  shutil.copytree(bundle, out)
  path = os.path.join(out, "manifest.json")
  with open(path, encoding="utf-8") as f:
    m = json.load(f)
  offset = 0
  # 26 x 38.5M rows; the written rows (all < 26 x 500) now lie in the first field's range,
  # still read from the bundle's files.
  for feature in m["features"]:
    feature["rows"], feature["offset"] = 38_461_539, offset
    offset += feature["rows"]
  m["tables"][0]["rows"] = offset
  with open(path, "w", encoding="utf-8") as f:
    json.dump(m, f)
  return offset


_SERVE_BILLION = """
import json, sys
import numpy as np
from sfjax.serving import Features, Predictor
from sfjax.serving.lazy_table import initial_rows
bundle, v = sys.argv[1], int(sys.argv[2])
p = Predictor.load(bundle, batch_sizes=(64, 4096), rows="cache")
rng = np.random.default_rng(0)
field_rows = p.field_rows
logits = []
for b in (64, 4096, 4096, 64):
  ids = (rng.random((b, p.num_fields)) * field_rows).astype(np.int64)  # across each field
  ids[:, 0] = rng.integers(0, 13_000, b)  # where the written rows are
  logits.append(p.logits_features(Features(ids, rng.normal(size=(b, p.num_dense)))))
high = np.asarray([v - 1, v // 2, 987_654_321], np.int64)  # never written
rule = p.manifest["tables"][0]["init"]
exact = bool(np.array_equal(np.asarray(p.rows.gather(high)), initial_rows(rule, high, p.width)))
with open("/proc/self/status") as f:  # VmHWM: this program's peak (ru_maxrss keeps pytest's)
  rss = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
print(json.dumps({"rss": rss,
                  "finite": bool(all(np.isfinite(x).all() for x in logits)),
                  "n": int(sum(x.size for x in logits)), "exact": exact,
                  "stats": p.rows.stats()}))
"""
RSS_BOUND = 2 << 30  # a ~10^9-row lazy table served in at most 2 GiB (measured ~0.5 GiB)


@pytest.mark.slow  # a fresh interpreter compiles batch 64 and 4096 (~15 s)
@pytest.mark.timeout(600)
def test_a_billion_row_lazy_bundle_serves_in_a_few_gib(lazy_run, tmp_path):
  _, bundle = lazy_run
  v = _as_billion_rows(bundle, str(tmp_path / "huge"))
  assert v > 10**9
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-c", _SERVE_BILLION, str(tmp_path / "huge"), str(v)],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["finite"] and out["exact"] and out["n"] == 2 * 64 + 2 * 4096
  assert out["stats"]["requests"] == 5 and out["stats"]["lookups"] > 0
  assert out["rss"] < RSS_BOUND, out["rss"]


@pytest.mark.slow  # the export CLI in a subprocess
@pytest.mark.timeout(600)
def test_the_export_cli_writes_a_lazy_bundle_for_an_mmap_run(lazy_run, tmp_path):
  run, bundle = lazy_run
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-m", "experiments.export", f"--workdir={run.workdir}",
                      "--serving", f"--out={tmp_path / 'b'}"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=500)
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads(r.stdout.strip().splitlines()[-1])
  with open(os.path.join(bundle, "manifest.json"), encoding="utf-8") as f:
    written = json.load(f)["tables"][0]["written"]["rows"]
  assert (summary["table_storage"], summary["stored_rows"]) == ("lazy", written)
  assert summary["num_rows"] == run.trainer.backend.num_rows > written

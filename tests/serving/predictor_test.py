"""`Predictor`: a bundle scores as the trainer evaluates, pads and splits batches, refuses
bad input and a damaged bundle (naming the file)."""

import os
import shutil

import numpy as np
import pytest

from sfjax.models import MODEL_NAMES
from sfjax.serving import BundleError, Features, Predictor, RecordError, write_bundle
from tests.serving import tiny_runs

# fp32 tables: the predictor's forward is the trainer's, compiled for other batch sizes, so
# logits agree to float32 rounding: |a - b| <= 1e-6 * (1 + |b|) (measured <= 1.5e-6 abs).
TOL = {"rtol": 1e-6, "atol": 1e-6}


@pytest.fixture(scope="module")
def deepfm(tmp_path_factory):
  """(run, bundle dir) of a tiny DeepFM on synthetic data, device backend."""
  root = tmp_path_factory.mktemp("deepfm")
  run = tiny_runs.train_run(root)
  bundle = str(root / "bundle")
  write_bundle(run.workdir, bundle)
  return run, bundle


def _round_trip(run, bundle, **load):
  logits, ids, dense, _ = tiny_runs.trainer_logits(run)
  predictor = Predictor.load(bundle, **load)
  got = predictor.logits_features(Features(ids, dense))
  np.testing.assert_allclose(got, logits, **TOL)
  return predictor, logits, ids, dense


def test_predictor_logits_equal_the_trainers_eval_logits(deepfm):
  predictor, logits, ids, dense = _round_trip(*deepfm, batch_sizes=(8, 64, 512))
  probs = predictor.predict_ids(ids[:100], dense[:100])
  assert probs.dtype == np.float32 and probs.shape == (100,)
  np.testing.assert_allclose(probs, 1 / (1 + np.exp(-logits[:100].astype(np.float64))),
                             rtol=1e-5)


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.slow)
                                   for m in (*MODEL_NAMES, "composed") if m != "deepfm"])
def test_every_model_round_trips(model, tmp_path):
  run = tiny_runs.train_run(tmp_path, model=model)
  write_bundle(run.workdir, str(tmp_path / "bundle"))
  _round_trip(run, str(tmp_path / "bundle"), batch_sizes=(64, 512))


@pytest.mark.slow
def test_cache_backend_round_trips(tmp_path):
  run = tiny_runs.train_run(tmp_path, backend="cache")
  write_bundle(run.workdir, str(tmp_path / "bundle"))
  _round_trip(run, str(tmp_path / "bundle"), batch_sizes=(512,), rows="mmap")


@pytest.mark.slow
def test_row_sharded_run_gives_the_same_predictions(tmp_path):
  run = tiny_runs.train_run(tmp_path, backend="cache", num_devices=8, sharding="row")
  write_bundle(run.workdir, str(tmp_path / "bundle"))
  _round_trip(run, str(tmp_path / "bundle"), batch_sizes=(512,))


def test_padding_and_chunking_do_not_change_scores(deepfm):
  run, bundle = deepfm
  _, ids, dense, _ = tiny_runs.trainer_logits(run)
  ids, dense = ids[:37], dense[:37]
  whole = Predictor.load(bundle, batch_sizes=(64,)).logits_features(Features(ids, dense))
  small = Predictor.load(bundle, batch_sizes=(1, 8))  # 37 = 4 chunks of 8, the last padded
  assert small.batch_sizes == (1, 8)
  np.testing.assert_allclose(small.logits_features(Features(ids, dense)), whole, **TOL)
  one = small.logits_features(Features(ids[:1], dense[:1]))
  np.testing.assert_allclose(one, whole[:1], **TOL)


def test_the_one_dispatch_path_scores_as_the_host_gather_path_bit_for_bit(deepfm):
  """rows="memory": the table on the device, gathered in the forward's program, with
  reused padded buffers (a long then a short request) = host rows copied in."""
  run, bundle = deepfm
  _, ids, dense, _ = tiny_runs.trainer_logits(run)
  device = Predictor.load(bundle, batch_sizes=(8, 64), device_gather_min_batch=1)
  mixed = Predictor.load(bundle, batch_sizes=(8, 64))  # 64 on the device, 8 not
  host = Predictor.load(bundle, batch_sizes=(8, 64), device_table=False)
  assert device.device_table and mixed.device_table and not host.device_table
  assert not Predictor.load(bundle, batch_sizes=(8,), rows="mmap").device_table
  assert not Predictor.load(bundle, batch_sizes=(8,)).device_table  # all below 64
  for n in (200, 37, 5, 64):
    want = host.logits_features(Features(ids[:n], dense[:n]))
    for p in (device, mixed):
      np.testing.assert_array_equal(p.logits_features(Features(ids[:n], dense[:n])), want)
  rows = device.rows.gather((ids[:8] + device.offsets[None, :]).reshape(-1))
  emb = rows.reshape(8, device.num_fields, device.width)
  np.testing.assert_array_equal(np.asarray(device.forward_logits(emb, dense[:8])),
                                device.logits_features(Features(ids[:8], dense[:8])))


def test_threads_sharing_a_predictor_get_their_own_scores(deepfm):
  """The reused input buffers are filled and read under a lock: 4 threads scoring
  different slices at once get the scores each slice gets alone."""
  from concurrent.futures import ThreadPoolExecutor
  run, bundle = deepfm
  _, ids, dense, _ = tiny_runs.trainer_logits(run)
  p = Predictor.load(bundle, batch_sizes=(64,))
  slices = [slice(i * 50, i * 50 + 50) for i in range(4)] * 10
  alone = [p.logits_features(Features(ids[s], dense[s])) for s in slices]
  with ThreadPoolExecutor(4) as pool:
    shared = list(pool.map(lambda s: p.logits_features(Features(ids[s], dense[s])), slices))
  for a, b in zip(alone, shared, strict=True):
    np.testing.assert_array_equal(a, b)


def test_bad_ids_and_records_are_refused_by_name(deepfm):
  run, bundle = deepfm
  p = Predictor.load(bundle, batch_sizes=(8,))
  rows = p.manifest["features"][2]["rows"]
  ids = np.zeros((2, p.num_fields), np.int64)
  ids[1, 2] = rows
  with pytest.raises(ValueError, match=rf"ids\[1, 2\] = {rows}: field 'C3'"):
    p.predict_ids(ids, np.zeros((2, p.num_dense), np.float32))
  with pytest.raises(ValueError, match="dense: expected"):
    p.predict_ids(ids[:1], np.zeros((1, 3), np.float32))
  with pytest.raises(ValueError, match="takes no per-id weights"):
    p.predict_ids(ids[:1] * 0, np.zeros((1, p.num_dense), np.float32), np.ones((1, p.num_fields)))
  good = {f["name"]: 0 for f in p.manifest["features"]} | {n: 0.5 for n in
                                                            p.manifest["dense"]["names"]}
  assert p.predict([good]).shape == (1,)
  with pytest.raises(RecordError, match="record 1: missing feature 'C1'"):
    p.predict([good, {k: v for k, v in good.items() if k != "C1"}])
  with pytest.raises(RecordError, match="record 0: feature 'C4' has the wrong type str"):
    p.predict([good | {"C4": "7"}])


def test_an_id_out_of_its_fields_rows_is_a_422_over_http(deepfm):
  """An "ids" bundle's records are range-checked by the predictor: the endpoint answers
  422 naming the id (here, with this module's synthetic-data bundle), then serves on."""
  import asyncio

  import httpx

  from sfjax.serving import ServerSettings, make_app
  _, bundle = deepfm
  p = Predictor.load(bundle, batch_sizes=(8,))
  good = {f["name"]: 1 for f in p.manifest["features"]} | {n: 0.5 for n in
                                                            p.manifest["dense"]["names"]}
  bad = good | {"C3": p.manifest["features"][2]["rows"]}
  app = make_app(p, ServerSettings(max_delay_ms=0))

  async def main():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
      return [await client.post("/v1/predict", json={"records": r}) for r in
              ([good, bad], [good])]

  try:
    refused, served = asyncio.run(main())
  finally:
    app.state.batcher.close()
  assert refused.status_code == 422 and "ids[1, 2]" in refused.json()["error"]
  assert "field 'C3'" in refused.json()["error"]
  np.testing.assert_array_equal(np.asarray(served.json()["scores"], np.float32),
                                p.predict([good]))


def _copy(bundle, tmp_path):
  out = str(tmp_path / "copy")
  shutil.copytree(bundle, out)
  return out


def test_a_flipped_byte_or_truncated_file_fails_load_naming_it(deepfm, tmp_path):
  _, bundle = deepfm
  copy = _copy(bundle, tmp_path)
  table = os.path.join(copy, "table", sorted(os.listdir(os.path.join(copy, "table")))[0])
  with open(table, "r+b") as f:
    f.seek(200)
    byte = f.read(1)
    f.seek(200)
    f.write(bytes([byte[0] ^ 1]))
  with pytest.raises(BundleError, match=f"{table}: bundle file is corrupt"):
    Predictor.load(copy)
  forward = os.path.join(copy, "forward.bin")
  with open(forward, "r+b") as f:
    f.truncate(os.path.getsize(forward) - 5)
  shutil.copyfile(os.path.join(bundle, os.path.relpath(table, copy)), table)
  with pytest.raises(BundleError, match=f"{forward}: bundle file is corrupt or truncated"):
    Predictor.load(copy)
  os.remove(os.path.join(copy, "manifest.json"))
  with pytest.raises(BundleError, match="manifest.json: no manifest"):
    Predictor.load(copy)


def test_a_device_row_cache_over_the_mmap_table_scores_the_same(deepfm):
  run, bundle = deepfm
  _, ids, dense, _ = tiny_runs.trainer_logits(run)
  ids, dense = ids[:600], dense[:600]
  want = Predictor.load(bundle, batch_sizes=(64,)).logits_features(Features(ids, dense))
  cached = Predictor.load(bundle, batch_sizes=(64,), rows="cache", cache_rows=64 * 26)
  assert cached.rows.capacity < cached.rows.num_rows  # the table does not fit: it evicts
  np.testing.assert_array_equal(cached.logits_features(Features(ids, dense)), want)
  stats = cached.rows.stats()
  assert stats["requests"] == 10 and stats["evictions"] > 0 and stats["hit_rate"] > 0.3


# A feature layout (issue #22): bags, a weighted bag, a history sequence sharing the item
# table. Padding columns read zeros through VSI in every row mode, as in training.
@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
@pytest.mark.parametrize("model", ["deepfm", "din"])
def test_layout_model_logits_equal_the_trainers_in_every_row_mode(model, request):
  served = request.getfixturevalue(f"layout_{model}")
  assert (served.ids < 0).any() and (served.weights[served.ids >= 0] != 1).any()  # real bags
  features = Features(served.ids, served.dense, served.weights)
  for rows in ("memory", "mmap", "cache"):
    predictor = Predictor.load(served.bundle, batch_sizes=(512,), rows=rows)
    np.testing.assert_allclose(predictor.logits_features(features), served.logits,
                               rtol=1e-5, atol=1e-6, err_msg=rows)
  records = tiny_runs.layout_records(served.ids[:70], served.dense[:70], served.weights[:70],
                                     predictor.layout)
  np.testing.assert_allclose(predictor.predict(records), predictor.predict_features(
      Features(served.ids[:70], served.dense[:70], served.weights[:70])), rtol=1e-6)
  if rows == "cache":
    assert predictor.rows.stats()["requests"] > 0


def test_layout_bundle_records_its_layout_and_refuses_bad_columns(layout_deepfm):
  predictor = Predictor.load(layout_deepfm.bundle, batch_sizes=(8,))
  manifest, layout = predictor.manifest, predictor.layout
  assert manifest["forward"]["inputs"]["weights"] == ["B", layout.num_columns]
  by_name = {f["name"]: f for f in manifest["features"]}
  assert by_name["history"]["table"] == by_name["item"]["table"] == "item"
  assert by_name["history"]["offset"] == by_name["item"]["offset"]
  assert by_name["bag0"]["weighted"] and by_name["history"]["kind"] == "sequence"
  ids, dense, weights = (x[:4].copy() for x in (layout_deepfm.ids, layout_deepfm.dense,
                                                 layout_deepfm.weights))
  with pytest.raises(ValueError, match="give per-id weights"):
    predictor.logits_features(Features(ids, dense))
  start = layout.columns(layout.features.index(
      next(f for f in layout.features if f.name == "history"))).start
  bad = ids.copy()
  bad[1, start] = 800  # the item table has 800 rows
  with pytest.raises(ValueError, match=r"ids\[1, .*feature 'history'.*table 'item'"):
    predictor.logits_features(Features(bad, dense, weights))
  pad = np.argwhere(ids == -1)[0]
  weights[pad[0], pad[1]] = 0.5
  with pytest.raises(ValueError, match="0 in padding columns"):
    predictor.logits_features(Features(ids, dense, weights))

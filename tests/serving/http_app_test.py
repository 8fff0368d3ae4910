"""sfjax/serving/http_app.py in-process (httpx's ASGI transport: no socket, no server thread).

A tiny DeepFM is trained on Criteo-format lines and exported as a bundle; the app serves
its `Predictor`. Scores through HTTP equal `predictor.predict` on the same records; a
fuzzed stream of bad requests (random JSON, wrong types, missing features, huge bodies)
gets only 4xx answers with a one-line message, and the server answers correctly after.
"""

import asyncio
import json
import random

import httpx
import numpy as np
import pytest
from starlette.requests import Request

from sfjax.core import metrics as metrics_lib
from sfjax.serving import Predictor
from sfjax.serving.http_app import BadRequest, ServerSettings, make_app, parse_body, read_body
from tests.serving import tiny_runs
from tests.serving.served_bundle import line_to_dict, make_served_bundle


@pytest.fixture(scope="module")
def served_predictor(tmp_path_factory):
  """(the tiny bundle's Predictor, its 300 held-out raw Criteo lines)."""
  bundle, lines = make_served_bundle(tmp_path_factory.mktemp("served"))
  return Predictor.load(bundle), lines


class AppClient:
  """A synchronous client of the app over httpx's ASGI transport (no socket, no thread).

  On exit it stops the app's batcher (what the ASGI lifespan's shutdown does).
  """

  def __init__(self, predictor, **settings):
    self.app = make_app(predictor, ServerSettings(**settings))
    self._runner = asyncio.Runner()
    self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                     base_url="http://test")

  def get(self, path: str) -> httpx.Response:
    return self._runner.run(self._client.get(path))

  def post(self, path: str, **kw) -> httpx.Response:
    return self._runner.run(self._client.post(path, **kw))

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._runner.run(self._client.aclose())
    self._runner.close()
    self.app.state.batcher.close()


def _client(predictor, **settings):
  return AppClient(predictor, **settings)


def _post(client, body):
  return client.post("/v1/predict", content=body, headers={"content-type": "application/json"})


def _check_refused(r, status=None):
  assert 400 <= r.status_code < 500, (r.status_code, r.text)
  if status is not None:
    assert r.status_code == status, (r.status_code, r.text)
  message = r.json()["error"]
  assert isinstance(message, str) and message and "\n" not in message
  return message


def test_scores_equal_predict_on_the_same_records(served_predictor):
  predictor, lines = served_predictor
  with _client(predictor) as client:
    for records in (lines[:1], lines[1:8], lines[8:72]):
      r = _post(client, json.dumps({"records": records}))
      assert r.status_code == 200, r.text
      scores = np.asarray(r.json()["scores"], np.float32)
      np.testing.assert_array_equal(scores, predictor.predict(records))  # float32 reads back
    r = _post(client, json.dumps({"records": [line_to_dict(line) for line in lines[:5]]}))
    np.testing.assert_array_equal(np.asarray(r.json()["scores"], np.float32),
                                  predictor.predict(lines[:5]))


def test_concurrent_requests_are_batched_and_each_gets_its_scores(served_predictor):
  predictor, lines = served_predictor
  app = make_app(predictor, ServerSettings(max_batch=64, max_delay_ms=50))
  cuts = [(i * 7, i * 7 + 1 + i % 5) for i in range(12)]

  async def main():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
      return await asyncio.gather(*(client.post("/v1/predict", json={"records": lines[a:b]})
                                    for a, b in cuts))

  try:
    answers = asyncio.run(main())
    stats = app.state.batcher.stats()
  finally:
    app.state.batcher.close()
  for (a, b), r in zip(cuts, answers, strict=True):
    assert r.status_code == 200, r.text
    # Batched with others: another padded batch size, equal up to float32 rounding.
    np.testing.assert_allclose(r.json()["scores"], predictor.predict(lines[a:b]), rtol=1e-5,
                               atol=1e-7)
  assert stats.requests == 12 and stats.batches < 12


def test_a_bad_record_fails_only_its_request_in_a_shared_batch(served_predictor):
  predictor, lines = served_predictor
  app = make_app(predictor, ServerSettings(max_batch=9, max_delay_ms=10_000))
  bad = line_to_dict(lines[5])
  del bad["C3"]
  bodies = [lines[:2], [lines[2], bad], lines[3:5], lines[6:9]]  # 9 examples: one batch

  async def main():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
      return await asyncio.gather(*(client.post("/v1/predict", json={"records": b})
                                    for b in bodies))

  try:
    answers = asyncio.run(main())
    stats = app.state.batcher.stats()
  finally:
    app.state.batcher.close()
  assert "record 1: missing feature 'C3'" in _check_refused(answers[1], 422)  # its own index
  for i in (0, 2, 3):
    assert answers[i].status_code == 200, answers[i].text
    np.testing.assert_allclose(answers[i].json()["scores"], predictor.predict(bodies[i]),
                               rtol=1e-5, atol=1e-7)
  assert stats.failed_batches == 2 and stats.batches == 5  # merged, then each alone


def test_health_metadata_and_stats(served_predictor):
  predictor, lines = served_predictor
  with _client(predictor) as client:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/v1/metadata").json() == json.loads(json.dumps(predictor.manifest))
    _post(client, json.dumps({"records": lines[:3]}))
    stats = client.get("/v1/stats").json()
    assert stats["requests"] == 1 and stats["examples"] == 3 and stats["batches"] == 1


@pytest.mark.parametrize("body,status,match", [
    (b"{not json", 400, "malformed JSON body"),
    (b"\xff\xfe", 400, "malformed JSON body"),
    (b"[1, 2]", 422, 'body must be a JSON object {"records": [...]}'),
    (b'{"rows": []}', 422, 'body must be a JSON object {"records": [...]}'),
    (b'{"records": "abc"}', 422, "records: must be a list, got str"),
    (b'{"records": [1]}', 422, "record 0: must be an object or a raw line"),
    (b'{"records": ["x", null]}', 422, "record 1: must be an object or a raw line"),
])
def test_bad_bodies_are_named(served_predictor, body, status, match):
  with _client(served_predictor[0]) as client:
    assert match in _check_refused(_post(client, body), status)


@pytest.mark.parametrize("body,status,match", [
    (b'{"records": ["a", "b", "c"]}', 413, "3 records exceed max_records=2"),
    (b"{", 400, "malformed JSON body: Expecting property name"),
    (b'{"records": {"a": 1}}', 422, "records: must be a list, got dict"),
    (b'{"records": ["a", 2.5]}', 422, "record 1: must be an object or a raw line"),
])
def test_parse_body_refusals(body, status, match):
  with pytest.raises(BadRequest, match=match) as err:
    parse_body(body, 2)
  assert err.value.status == status
  assert parse_body(b'{"records": ["a", {"C1": "x"}]}', 2) == ["a", {"C1": "x"}]


def _request(chunks, headers=()):
  """A Starlette request whose body arrives in `chunks` (no socket)."""
  messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
              for i, c in enumerate(chunks)]

  async def receive():
    return messages.pop(0)

  scope = {"type": "http", "method": "POST", "path": "/v1/predict",
           "headers": [(k.encode(), v.encode()) for k, v in headers]}
  return Request(scope, receive)


def test_read_body_stops_at_the_limit():
  body = asyncio.run(read_body(_request([b"ab", b"cd"]), 4))
  assert body == b"abcd"
  with pytest.raises(BadRequest, match="body exceeds max_body_bytes=3") as err:
    asyncio.run(read_body(_request([b"ab", b"cd", b"never read"]), 3))
  assert err.value.status == 413
  with pytest.raises(BadRequest, match="body of 99 bytes exceeds max_body_bytes=3"):
    asyncio.run(read_body(_request([b"ab"], [("content-length", "99")]), 3))
  with pytest.raises(BadRequest, match="bad Content-Length header 'x'") as err:
    asyncio.run(read_body(_request([b"ab"], [("content-length", "x")]), 3))
  assert err.value.status == 400


def test_size_limits_and_a_full_queue(served_predictor):
  predictor, lines = served_predictor
  with _client(predictor, max_records=4, max_body_bytes=20_000, max_queue=2) as client:
    assert "5 records exceed max_records=4" in _check_refused(
        _post(client, json.dumps({"records": lines[:5]})), 413)
    huge = json.dumps({"records": ["x" * 30_000]})
    assert "exceeds max_body_bytes=20000" in _check_refused(_post(client, huge), 413)

    async def chunks():  # no Content-Length: the stream is cut at the limit
      yield b'{"records": ["'
      for _ in range(100):
        yield b"y" * 1000

    assert "body exceeds max_body_bytes=20000" in _check_refused(_post(client, chunks()), 413)
    r = _post(client, json.dumps({"records": lines[:3]}))  # 3 > max_queue=2 examples
    assert r.status_code == 503 and "queue full" in r.json()["error"]
    assert r.headers["retry-after"] == "1"
    r = _post(client, json.dumps({"records": lines[:2]}))
    np.testing.assert_array_equal(np.asarray(r.json()["scores"], np.float32),
                                  predictor.predict(lines[:2]))


def _random_json(rng: random.Random, depth: int = 0):
  kind = rng.randrange(8 if depth < 3 else 5)
  if kind == 0:
    return None
  if kind == 1:
    return rng.choice([True, False, 0, -1, 2**70, 1.5, -1e308, float("nan"), float("inf")])
  if kind == 2:
    return "".join(rng.choice("ab\t\n\\\"\u00e9\x00{}[]0123456789") for _ in range(rng.randrange(50)))
  if kind == 3:
    return rng.randrange(-10, 10**6)
  if kind == 4:
    return ""
  if kind == 5:
    return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
  return {rng.choice(["records", "C1", "I1", "label", "x"]): _random_json(rng, depth + 1)
          for _ in range(rng.randrange(4))}


def _bad_records(rng: random.Random, lines) -> list:
  """A record list holding one broken record among good ones."""
  good = [rng.choice(lines) for _ in range(rng.randrange(3))]
  line = rng.choice(lines)
  record = line_to_dict(line)
  key = rng.choice(sorted(record))
  broken = rng.choice([
      lambda: {k: v for k, v in record.items() if k != key},  # a missing feature
      lambda: dict(record, **{key: [1, 2]}),  # a list where a value belongs
      lambda: dict(record, **{key: {"nested": 1}}),
      lambda: "\t".join(line.split("\t")[:rng.randrange(1, 39)]),  # too few fields
      lambda: line.replace("\t", "\t\t", 1),  # too many fields
      lambda: "\t".join(["x", *line.split("\t")[1:]]),  # a label that is not 0/1
      lambda: "\t".join([line.split("\t")[0], "1.5", *line.split("\t")[2:]]),  # non-int count
      lambda: line + "\x00",
  ])()
  good.insert(rng.randrange(len(good) + 1), broken)
  return good


def test_fuzzed_requests_get_only_4xx_then_correct_answers(served_predictor):
  predictor, lines = served_predictor
  rng = random.Random(0)
  statuses = {}
  with _client(predictor, max_records=64, max_body_bytes=1 << 16) as client:
    for i in range(300):
      choice = i % 6
      if choice == 0:
        body = json.dumps(_random_json(rng)).encode()
      elif choice == 1:
        body = json.dumps({"records": _random_json(rng)}).encode()
      elif choice == 2:
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
      elif choice == 3:
        good = json.dumps({"records": lines[:3]}).encode()
        body = good[:rng.randrange(1, len(good) - 1)]  # truncated
      elif choice == 4:
        body = json.dumps({"records": _bad_records(rng, lines)}).encode()
      else:
        body = json.dumps({"records": [rng.choice(lines)] * rng.choice([65, 2000])}).encode()
      r = _post(client, body)
      if r.status_code == 200:  # random JSON can be a valid empty request
        assert r.json() == {"scores": []}, body[:200]
        continue
      _check_refused(r)
      statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    r = _post(client, json.dumps({"records": lines[:10]}))
    assert r.status_code == 200
    np.testing.assert_array_equal(np.asarray(r.json()["scores"], np.float32),
                                  predictor.predict(lines[:10]))
    assert client.get("/healthz").status_code == 200
  assert set(statuses) >= {400, 413, 422}, statuses


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match="ServerSettings.max_records:"):
    ServerSettings(max_records=0)
  with pytest.raises(ValueError, match="BatcherSettings.max_batch:"):
    ServerSettings(max_batch=0)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_a_layout_models_list_features_score_as_the_trainer_evaluated_them(layout_deepfm):
  predictor = Predictor.load(layout_deepfm.bundle, batch_sizes=(8, 64))
  n = 12
  records = tiny_runs.layout_records(layout_deepfm.ids[:n], layout_deepfm.dense[:n],
                                     layout_deepfm.weights[:n], predictor.layout)
  assert any(isinstance(v, list) and len(v) > 1 for v in records[0].values())
  with _client(predictor) as client:
    r = _post(client, json.dumps({"records": records}))
    assert r.status_code == 200, r.text
    scores = np.asarray(r.json()["scores"], np.float32)
    np.testing.assert_allclose(scores, metrics_lib.sigmoid(layout_deepfm.logits[:n]),
                               rtol=1e-5, atol=1e-7)
    bad = dict(records[0], history=[1, "x"])
    message = _check_refused(_post(client, json.dumps({"records": [records[0], bad]})), 422)
    assert "record 1" in message and "'history'" in message

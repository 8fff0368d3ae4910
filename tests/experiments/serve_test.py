"""`python -m experiments.serve`: a bundle served over loopback, and its flags."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from experiments import serve
from sfjax.serving import Predictor, ServerSettings
from tests.serving.served_bundle import make_served_bundle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_bundle(tmp_path_factory):
  """(a tiny DeepFM's bundle dir, its held-out raw Criteo lines)."""
  return make_served_bundle(tmp_path_factory.mktemp("served"))


def test_parse_batch_sizes():
  assert serve.parse_batch_sizes("1,8, 64") == (1, 8, 64)
  for bad in ("", "0,8", "a,8"):
    with pytest.raises(ValueError, match="--batch_sizes:"):
      serve.parse_batch_sizes(bad)


def test_resolve_stack():
  assert serve.resolve_stack("auto", "auto") == ("httptools", "uvloop")  # both installed
  assert serve.resolve_stack("h11", "asyncio") == ("h11", "asyncio")


def test_build_app_serves_the_bundle(served_bundle):
  bundle, lines = served_bundle
  app = serve.build_app(bundle, ServerSettings(max_batch=16), (1, 8, 64))
  transport = httpx.ASGITransport(app=app)

  async def main():
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
      return await client.post("/v1/predict", json={"records": lines[:5]})

  try:
    r = asyncio.run(main())
  finally:
    app.state.batcher.close()
  assert r.status_code == 200
  expected = Predictor.load(bundle, batch_sizes=(8,)).predict(lines[:5])
  np.testing.assert_array_equal(np.asarray(r.json()["scores"], np.float32), expected)


def test_serve_answers_on_loopback_and_refuses_bad_flags(served_bundle):
  bundle, lines = served_bundle
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  proc = subprocess.Popen([sys.executable, "-m", "experiments.serve", f"--bundle={bundle}",
                           f"--port={port}", "--batch_sizes=1,8,64", "--max_delay_ms=1"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  try:
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while time.monotonic() < deadline:
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      try:
        if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
          break
      except httpx.HTTPError:
        time.sleep(0.2)
    r = httpx.post(f"{url}/v1/predict", json={"records": lines[:3]}, timeout=10)
    assert r.status_code == 200 and len(r.json()["scores"]) == 3
    assert httpx.post(f"{url}/v1/predict", content=b"{", timeout=10).status_code == 400
    manifest = httpx.get(f"{url}/v1/metadata", timeout=10).json()
    assert manifest == json.loads(json.dumps(Predictor.load(bundle, batch_sizes=(1,)).manifest))
  finally:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
  assert f"on http://127.0.0.1:{port}" in err  # loopback unless told otherwise
  assert "http stack: uvicorn" in err and "http=httptools loop=uvloop" in err  # auto's pick
  bad = subprocess.run([sys.executable, "-m", "experiments.serve", f"--bundle={bundle}",
                        "--batch_sizes=0"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
  assert bad.returncode != 0 and "--batch_sizes: needs sizes >= 1" in bad.stderr

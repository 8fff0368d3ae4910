"""sfjax/serving/load_client.py: the bench's closed-loop clients against a real socket server.

The server here is a small asyncio HTTP/1.1 server on 127.0.0.1 that answers each request
by its body: good scores, a 503, scores of the wrong length, a cut connection, or no answer
at all; both clients must count each the same way.
"""

import asyncio
import json
import math
import os
import time

import pytest

from sfjax.serving import load_client as lc


async def _answer(reader, writer):
  """Serves one keep-alive connection; the request body names the answer."""
  try:
    while True:
      head = await reader.readuntil(b"\r\n\r\n")
      length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")), 0)
      kind = (await reader.readexactly(length)).decode() if length else "get"
      if kind == "hang":
        await asyncio.sleep(5)
        return
      if kind == "cut":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"sco")
        await writer.drain()
        return
      status, body = {
          "good": (200, {"scores": [0.25, 0.5]}),
          "short": (200, {"scores": [0.25]}),
          "busy": (503, {"error": "queue full"}),
          "get": (200, {"requests": 7}),
      }[kind]
      data = json.dumps(body).encode()
      writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)
      await writer.drain()
  except (asyncio.IncompleteReadError, ConnectionError):
    pass
  finally:
    writer.close()


def _run_against_server(client: str, kinds: list[str], concurrency: int, max_requests: int,
                        seconds: float = 5.0, timeout_s: float = 0.5) -> lc.LoadCounts:
  async def main():
    server = await asyncio.start_server(_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    payloads = [lc.encode_request("POST", "127.0.0.1", port, "/v1/predict", k.encode())
                for k in kinds]
    conns = lc.open_connections(client, "127.0.0.1", port, concurrency, timeout_s)
    try:
      stats = await lc.get_json(conns[0], "127.0.0.1", port, "/v1/stats", timeout_s)
      assert stats == {"requests": 7}
      return await lc.drive(conns, payloads, 2, seconds, max_requests, timeout_s)
    finally:
      await lc.close_connections(conns)
      server.close()

  return lc.run(main())


@pytest.mark.parametrize("client", lc.LOAD_CLIENTS)
def test_every_answer_is_verified_and_counted(client):
  kinds = ["good", "good", "busy", "short", "cut", "good"]
  counts = _run_against_server(client, kinds, concurrency=1, max_requests=12)
  # One loop sends kinds[0], kinds[1], ... twice over: 6 good, 2 busy, 2 short, 2 cut.
  assert counts.sent == 12 and len(counts.latencies) == 6
  assert counts.errors == 2 and counts.lost == 4
  assert all(0 < t < 5 for t in counts.latencies) and counts.seconds > 0


@pytest.mark.parametrize("client", lc.LOAD_CLIENTS)
def test_an_unanswered_request_is_lost_after_the_timeout_and_the_loop_goes_on(client):
  t = time.perf_counter()
  # A timeout of 1 s: the answered requests (a new connection after each timeout) fit in
  # it on a loaded 2-core machine (0.3 s once lost one of them, httpx, in a full `make test`).
  counts = _run_against_server(client, ["hang", "good"], concurrency=1, max_requests=4,
                               timeout_s=1.0)
  assert counts.sent == 4 and counts.lost == 2 and len(counts.latencies) == 2
  assert time.perf_counter() - t < 4.5  # two timeouts of 1 s, not one of the server's 5 s


def test_the_run_is_bounded_in_count_across_connections():
  counts = _run_against_server("raw", ["good"], concurrency=4, max_requests=50)
  assert counts.sent == 50 == len(counts.latencies) and counts.errors == counts.lost == 0


def test_the_run_is_bounded_in_time():
  counts = _run_against_server("raw", ["good"], concurrency=2, max_requests=10**9,
                               seconds=0.3)
  assert 0.3 <= counts.seconds < 2 and counts.sent == len(counts.latencies) > 10


def test_encode_request():
  assert lc.encode_request("POST", "127.0.0.1", 80, "/v1/predict", b"{}") == (
      b"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1:80\r\nContent-Type: application/json\r\n"
      b"Content-Length: 2\r\n\r\n{}")
  assert lc.encode_request("GET", "h", 1, "/x") == b"GET /x HTTP/1.1\r\nHost: h:1\r\n\r\n"


def test_parse_head():
  assert lc.parse_head(b"HTTP/1.1 200 OK\r\ncontent-type: x\r\nContent-Length: 12\r\n\r\n") == (
      200, 12, False)
  assert lc.parse_head(b"HTTP/1.1 503 B\r\nContent-Length: 0\r\nConnection: close\r\n\r\n") == (
      503, 0, True)
  assert lc.parse_head(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n")[2]  # 1.0 closes
  for bad, match in ((b"SPDY 200\r\n\r\n", "bad status line"),
                     (b"HTTP/1.1 abc OK\r\nContent-Length: 1\r\n\r\n", "bad status line"),
                     (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                      "without Content-Length"),
                     (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "bad Content-Length")):
    with pytest.raises(lc.ProtocolError, match=match):
      lc.parse_head(bad)


@pytest.mark.parametrize("body,size,ok", [
    (b'{"scores": [0.1, 1.0]}', 2, True),
    (b'{"scores": [0, 0.5]}', 2, True),
    (b'{"scores": [0.1]}', 2, False),  # one score short
    (b'{"scores": [0.1, 1.5]}', 2, False),  # not a probability
    (b'{"scores": [0.1, NaN]}', 2, False),
    (b'{"scores": [0.1, true]}', 2, False),
    (b'{"scores": [0.1, "0.2"]}', 2, False),
    (b'[0.1, 0.2]', 2, False),
    (b'{"scores": [0.1, 0.2', 2, False),
    (b'\xff', 2, False),
])
def test_valid_scores(body, size, ok):
  assert lc.valid_scores(body, size) is ok


def test_process_cpu_seconds_counts_this_process():
  before = lc.process_cpu_seconds(os.getpid())
  end = time.process_time() + 0.05
  while time.process_time() < end:
    pass
  assert lc.process_cpu_seconds(os.getpid()) - before >= 0.03
  assert math.isnan(lc.process_cpu_seconds(2**31 - 1))  # no such process


def test_an_unknown_client_is_named():
  with pytest.raises(ValueError, match="client: unknown 'curl'"):
    lc.open_connections("curl", "127.0.0.1", 1, 1, 1.0)

"""Closed-loop HTTP/1.1 load over loopback for `experiments.bench_serving` (issue #23 item 6).

Two clients drive the endpoint the same way: `concurrency` keep-alive connections, each
sending its next request when the last one is answered, for `seconds` or `max_requests`
in all, whichever comes first.

  raw    asyncio streams on a uvloop loop speaking HTTP/1.1 itself: the request bytes
         (request line, headers and body) are encoded once before the run; a response is
         read as its status line and headers (up to the blank line), then exactly
         Content-Length body bytes. The lean client: on a 2-core machine the load generator
         shares the cores with the server, and every CPU-millisecond it spends per request
         is taken from the server.
  httpx  one `httpx.AsyncClient` (a pool of one connection) per closed loop: the usual
         Python client, kept for comparison.

Both verify every answer alike: a 200 whose body is not a JSON object `{"scores": [...]}`
with one probability in [0, 1] per example counts as `lost`, as does a transport error, a
malformed response or no answer within `timeout_s` (the connection is then reopened); any
other status counts as an `error`. Only verified answers give latencies.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

LOAD_CLIENTS = ("raw", "httpx")
_MAX_HEAD_BYTES = 64 << 10  # a response head longer than this is malformed


class LoadCounts(NamedTuple):
  """The raw counts of one closed-loop run.

  Attributes:
    latencies: seconds of each verified answer, in completion order.
    sent: requests sent.
    errors: answers with a status other than 200.
    lost: requests without a verified answer (transport error, timeout, bad response).
    seconds: wall-clock seconds of the run.
  """

  latencies: list[float]
  sent: int
  errors: int
  lost: int
  seconds: float


class ProtocolError(Exception):
  """A response this client cannot read (no status line, no Content-Length, oversized)."""


def encode_request(method: str, host: str, port: int, path: str, body: bytes = b"") -> bytes:
  """The bytes of one HTTP/1.1 keep-alive request (a JSON body when `body` is given)."""
  head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
  if method == "POST":
    head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
  return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


def parse_head(head: bytes) -> tuple[int, int, bool]:
  """(status, Content-Length, whether the server closes the connection) of a response head
  (its status line and headers, the blank line included or not).

  Raises:
    ProtocolError: no HTTP/1.x status line, or no Content-Length (chunked bodies are not
      read: the endpoint always sends a length).
  """
  lines = head.rstrip(b"\r\n").split(b"\r\n")
  parts = lines[0].split(b" ", 2)
  if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
    raise ProtocolError(f"bad status line {lines[0][:80]!r}")
  length, close = None, parts[0] == b"HTTP/1.0"
  for line in lines[1:]:
    name, _, value = line.partition(b":")
    name = name.strip().lower()
    if name == b"content-length":
      if not value.strip().isdigit():
        raise ProtocolError(f"bad Content-Length {value.strip()[:40]!r}")
      length = int(value)
    elif name == b"connection":
      close = value.strip().lower() == b"close"
  if length is None:
    raise ProtocolError("response without Content-Length")
  return int(parts[1]), length, close


def valid_scores(body: bytes, size: int) -> bool:
  """Whether `body` is `{"scores": [p, ...]}` with `size` numbers, each in [0, 1]."""
  try:
    payload = json.loads(body)
  except ValueError:
    return False
  scores = payload.get("scores") if isinstance(payload, dict) else None
  return (isinstance(scores, list) and len(scores) == size
          and all(isinstance(p, (int, float)) and not isinstance(p, bool)
                  and math.isfinite(p) and 0.0 <= p <= 1.0 for p in scores))


class RawConnection:
  """One keep-alive HTTP/1.1 connection on asyncio streams (reopened after a failure)."""

  def __init__(self, host: str, port: int):
    self.host, self.port = host, port
    self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

  async def request(self, payload: bytes) -> tuple[int, bytes]:
    """Sends the encoded request `payload`; (status, body) of its response.

    Raises:
      OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ProtocolError: a
      failed exchange (the connection is then unusable: `close` it).
    """
    if self._streams is None:
      self._streams = await asyncio.open_connection(self.host, self.port,
                                                    limit=_MAX_HEAD_BYTES)
    reader, writer = self._streams
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    status, length, close = parse_head(head)
    body = await reader.readexactly(length)
    if close:
      self.close()
    return status, body

  def close(self) -> None:
    """Closes the connection; the next request opens a new one."""
    if self._streams is not None:
      self._streams[1].close()
      self._streams = None


class HttpxConnection:
  """One `httpx.AsyncClient` limited to one connection, for the same requests."""

  def __init__(self, host: str, port: int, timeout_s: float):
    import httpx  # only this client needs it

    self._httpx = httpx
    self._client = httpx.AsyncClient(
        base_url=f"http://{host}:{port}", timeout=timeout_s,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

  async def request(self, payload: bytes) -> tuple[int, bytes]:
    """Sends the request `encode_request` encoded as `payload` (its method, path and body)."""
    head, _, body = payload.partition(b"\r\n\r\n")
    method, path, _ = head.split(b"\r\n", 1)[0].decode("ascii").split(" ")
    headers = {"content-type": "application/json"} if method == "POST" else None
    try:
      r = await self._client.request(method, path, content=body or None, headers=headers)
    except self._httpx.HTTPError as err:  # counted as the raw client's transport errors
      raise ConnectionError(f"httpx: {err!r}") from err
    return r.status_code, r.content

  def close(self) -> None:
    """Nothing to do per failure: the pool reconnects by itself (`aclose` ends it)."""

  async def aclose(self) -> None:
    """Ends the client."""
    await self._client.aclose()


def open_connections(client: str, host: str, port: int, count: int,
                     timeout_s: float) -> list[Any]:
  """`count` connections of `client` ("raw" or "httpx"); opened on their first request."""
  if client not in LOAD_CLIENTS:
    raise ValueError(f"client: unknown {client!r} (known: {', '.join(LOAD_CLIENTS)})")
  if client == "raw":
    return [RawConnection(host, port) for _ in range(count)]
  return [HttpxConnection(host, port, timeout_s) for _ in range(count)]


async def close_connections(connections: Sequence[Any]) -> None:
  """Closes every connection of `open_connections`."""
  for c in connections:
    c.close()
    if isinstance(c, HttpxConnection):
      await c.aclose()


async def get_json(connection, host: str, port: int, path: str, timeout_s: float) -> Any:
  """The JSON body of `GET path` (a 200 expected) over `connection`."""
  async with asyncio.timeout(timeout_s):
    status, body = await connection.request(encode_request("GET", host, port, path))
  if status != 200:
    raise ProtocolError(f"GET {path}: status {status}")
  return json.loads(body)


async def drive(connections: Sequence[Any], payloads: Sequence[bytes], size: int,
                seconds: float, max_requests: int, timeout_s: float) -> LoadCounts:
  """One closed loop per connection; see the module docstring.

  Args:
    connections: from `open_connections`.
    payloads: encoded requests (`encode_request`), each of `size` examples; loop k sends
      payloads[(i + k) % len(payloads)] for the i-th request of the run.
    size: examples per request (the scores each answer must hold).
    seconds, max_requests: the run's bounds (no request starts after either).
    timeout_s: a request unanswered this long is lost.
  """
  end, counter = time.perf_counter() + seconds, itertools.count()
  latencies: list[float] = []
  counts = {"errors": 0, "lost": 0, "sent": 0}

  async def loop(connection, offset: int) -> None:
    while time.perf_counter() < end and (i := next(counter)) < max_requests:
      counts["sent"] += 1
      t = time.perf_counter()
      try:
        async with asyncio.timeout(timeout_s):
          status, body = await connection.request(payloads[(i + offset) % len(payloads)])
      except (OSError, TimeoutError, ProtocolError, asyncio.IncompleteReadError,
              asyncio.LimitOverrunError):
        counts["lost"] += 1
        connection.close()
        continue
      if status != 200:
        counts["errors"] += 1
      elif valid_scores(body, size):
        latencies.append(time.perf_counter() - t)
      else:
        counts["lost"] += 1

  t0 = time.perf_counter()
  await asyncio.gather(*(loop(c, k) for k, c in enumerate(connections)))
  return LoadCounts(latencies, counts["sent"], counts["errors"], counts["lost"],
                    time.perf_counter() - t0)


def process_cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of process `pid` so far, all its threads (/proc/<pid>/stat;
  NaN where there is no /proc)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return float("nan")
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def new_event_loop() -> asyncio.AbstractEventLoop:
  """A uvloop loop when uvloop is installed (the server's too), else asyncio's."""
  try:
    import uvloop
  except ImportError:
    return asyncio.new_event_loop()
  return uvloop.new_event_loop()


def run(coroutine) -> Any:
  """Runs `coroutine` to completion on a fresh `new_event_loop()`."""
  with asyncio.Runner(loop_factory=new_event_loop) as runner:
    return runner.run(coroutine)


class LevelRun(NamedTuple):
  """One measured load level (`measure_level`)."""

  drive: Any  # `drive`'s result over the timed window (latencies, sent, errors, lost, seconds)
  stats_before: Any  # the server's GET /v1/stats before the timed window
  stats_after: Any  # ... and after it
  client_cpu_s: float  # this process's CPU seconds over the timed window
  server_cpu_s: float  # the server process's CPU seconds over the timed window


def measure_level(client: str, host: str, port: int, payloads: Sequence[bytes], size: int,
                  concurrency: int, warmup_s: float, seconds: float, max_requests: int,
                  timeout_s: float, server_pid: int) -> LevelRun:
  """Drives `concurrency` connections of `client` with `payloads` (pre-encoded requests of
  `size` examples): `warmup_s` untimed, then `seconds` (at most `max_requests`) timed, with
  the server's stats and both processes' CPU time around the timed window."""

  async def level() -> LevelRun:
    conns = open_connections(client, host, port, concurrency, timeout_s)
    try:
      await drive(conns, payloads, size, warmup_s, max_requests, timeout_s)
      before = await get_json(conns[0], host, port, "/v1/stats", timeout_s)
      cpu = time.process_time(), process_cpu_seconds(server_pid)
      raw = await drive(conns, payloads, size, seconds, max_requests, timeout_s)
      cpu = time.process_time() - cpu[0], process_cpu_seconds(server_pid) - cpu[1]
      after = await get_json(conns[0], host, port, "/v1/stats", timeout_s)
    finally:
      await close_connections(conns)
    return LevelRun(raw, before, after, *cpu)

  return run(level())

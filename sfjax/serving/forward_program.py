"""The predictor's compiled programs: the bundle's forward, alone or behind a row gather.

A bundle's forward (`jax.export`, batch symbolic) takes `(leaves, emb [B, C, E], dense
[B, Nd][, weights [B, S]]) -> logits [B]`. The predictor compiles it per batch size in
one of two programs (issue #23, the in-process targets):

  compile_gathered_forward         emb gathered by the caller (host rows, the device row cache,
                          a feature layout's VSI rows): one input copy of B x C x E floats
  compile_gather_forward  the table resident on the device and `emb = table[ids + offsets]`
                          gathered inside the same program: one dispatch per batch, and
                          one input buffer crosses to the device, `packed [B, F + Nd]`
                          float32: the int32 ids' bits, then the dense features
                          (`packed_views`; one copy-in instead of two: 4-20 us of
                          a 0.13 ms call at batch 1 on 2 cores)

Both compute the same float32 logits bit for bit: the gather only copies rows, and the
forward's XLA program is the same either side of it (`promise_in_bounds`: the ids are
range-checked on the host, so the gather needs no out-of-bounds select; with the
select of `jnp.take`'s default mode, XLA fused differently and scores moved by 6e-8).

`DeviceGather` holds the table on the device and that program per batch size, with
reused packed input buffers.

`compiler_options` are XLA debug options for these compiles only (e.g.
`{"xla_cpu_use_onednn": True}`), not process-wide `XLA_FLAGS`; `parse_compiler_options`
reads them from a flag's text.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

# The largest global row the in-program gather addresses (its ids are int32 on the device).
MAX_DEVICE_ROWS = 2**31 - 1
# The most of a device's memory (`memory_stats()["bytes_limit"]`) the table may take.
MAX_TABLE_SHARE = 0.5


def table_fits(num_rows: int, table_bytes: int, memory_stats: Mapping[str, Any] | None) -> bool:
  """Whether a table of `num_rows` rows and `table_bytes` bytes may live on a device with
  `memory_stats` (`jax.Device.memory_stats()`: None on CPU, where device memory is RAM
  and the host copy becomes a view of it): int32 row ids, and at most MAX_TABLE_SHARE of
  the device's memory (a GPU keeps room for the programs and the batches)."""
  limit = (memory_stats or {}).get("bytes_limit")
  return num_rows <= MAX_DEVICE_ROWS and (not limit or table_bytes <= MAX_TABLE_SHARE * limit)


def parse_compiler_options(text: str) -> dict[str, Any]:
  """'xla_cpu_use_onednn=true,xla_cpu_prefer_vector_width=512' -> {name: bool | int | str}
  (an empty value stays '': `xla_cpu_experimental_ynn_fusion_type=` turns YNNPACK off).

  Raises:
    ValueError: naming an item that is not `name=value` with a `xla_` name.
  """
  options: dict[str, Any] = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    name, sep, value = item.partition("=")
    name = name.strip().removeprefix("--")
    if not sep or not name.startswith("xla_"):
      raise ValueError(f"compiler_options: {item!r} is not xla_<name>=<value>")
    value = value.strip()
    lowered = value.lower()
    options[name] = (lowered == "true" if lowered in ("true", "false")
                     else int(value) if value.lstrip("-").isdigit() else value)
  return options


def _compile(fn, args: tuple, options: Mapping[str, Any] | None):
  """`fn` jitted, lowered on `args` (arrays or ShapeDtypeStructs) and compiled."""
  lowered = jax.jit(fn).lower(*args)
  return lowered.compile(compiler_options=dict(options)) if options else lowered.compile()


def compile_gathered_forward(forward, params: list, batch: int, columns: int, width: int,
                    num_dense: int, *, with_weights: bool = False,
                    options: Mapping[str, Any] | None = None):
  """The forward alone for `batch` examples: `(params, emb [b, C, E], dense [b, Nd]
  [, weights [b, C]]) -> logits [b]` (a compiled `jax.stages.Compiled`).

  Args:
    forward: the bundle's deserialized `jax.export.Exported`.
    params: its dense leaves (device arrays).
    batch: b, the compiled batch size.
    columns: C, embedding columns per example (fields, or a layout's id columns).
    width: E, the stored row width.
    num_dense: Nd, dense features per example.
    with_weights: the forward of a feature layout (per-id weights [b, C]).
    options: XLA compiler options of this compile (None: the defaults).
  """
  emb = jax.ShapeDtypeStruct((batch, columns, width), np.float32)
  dense = jax.ShapeDtypeStruct((batch, num_dense), np.float32)
  weights = [jax.ShapeDtypeStruct((batch, columns), np.float32)] if with_weights else []
  return _compile(forward.call, (params, emb, dense, *weights), options)


def packed_views(packed: np.ndarray, num_fields: int) -> tuple[np.ndarray, np.ndarray]:
  """(ids int32 [b, F], dense float32 [b, Nd]): writable views of a packed float32 input
  buffer [b, F + Nd] of `compile_gather_forward` (the ids stored as their int32 bits)."""
  return packed[:, :num_fields].view(np.int32), packed[:, num_fields:]


def compile_gather_forward(forward, params: list, table: jax.Array, offsets: np.ndarray,
                           batch: int, num_dense: int, *,
                           options: Mapping[str, Any] | None = None):
  """Gather and forward as one program for `batch` examples: `(params, table [V, E],
  packed [b, F + Nd]) -> logits [b]`, where packed holds the local rows ids int32 [b, F]
  (bit-cast to float32) and the dense [b, Nd] (`packed_views`); emb = table[ids + offsets].

  Args:
    forward: the bundle's deserialized `jax.export.Exported`.
    params: its dense leaves (device arrays).
    table: the whole table on the device, float32 [V, E] with V <= MAX_DEVICE_ROWS.
    offsets: [F] each field's first global row.
    batch: b, the compiled batch size.
    num_dense: Nd, dense features per example.
    options: XLA compiler options of this compile (None: the defaults).

  Raises:
    ValueError: a table too large for int32 row ids.
  """
  if table.shape[0] > MAX_DEVICE_ROWS:
    raise ValueError(f"table: {table.shape[0]} rows exceed int32 row ids; gather on the host")
  starts = np.asarray(offsets, np.int32)[None, :]  # [1, F], a constant of the program
  fields = starts.shape[1]

  def gather_forward(params, table, packed):
    ids = jax.lax.bitcast_convert_type(packed[:, :fields], np.int32)  # [b, F]
    emb = table.at[ids + starts].get(mode="promise_in_bounds")  # [b, F, E]; ids checked
    return forward.call(params, emb, packed[:, fields:])

  packed = jax.ShapeDtypeStruct((batch, fields + num_dense), np.float32)
  return _compile(gather_forward, (params, table, packed), options)


class DeviceGather:
  """The table on the device and `compile_gather_forward` per batch size, fed through
  one reused packed input buffer per size.

  Threads may share it: a call fills its size's buffer and waits for the logits under
  one lock (the buffer is read by the call until its logits are back).

  Args:
    forward: the bundle's deserialized `jax.export.Exported`.
    params: its dense leaves (device arrays).
    table: float32 [V, E] (host rows; put on the device here).
    offsets: [F] each field's first global row.
    batch_sizes: the sizes compiled (each a program and a buffer).
    num_dense: Nd, dense features per example.
    options: XLA compiler options of the compiles (None: the defaults).
  """

  def __init__(self, forward, params: list, table: np.ndarray, offsets: np.ndarray,
               batch_sizes: Sequence[int], num_dense: int, *,
               options: Mapping[str, Any] | None = None):
    self.table = jax.device_put(table)  # [V, E]
    self.num_fields = int(np.asarray(offsets).shape[0])
    self.programs = {int(b): compile_gather_forward(forward, params, self.table, offsets,
                                                    int(b), num_dense, options=options)
                     for b in batch_sizes}
    self._packed = {b: np.zeros((b, self.num_fields + num_dense), np.float32)
                    for b in self.programs}  # per size: the ids' bits, then the dense
    self._lock = threading.Lock()

  def __call__(self, params: list, ids: np.ndarray, dense: np.ndarray, size: int) -> np.ndarray:
    """float32 logits [m] of m <= size examples: local rows ids [m, F] (range-checked:
    int32 holds them) and dense [m, Nd], padded to `size` with zeros (local row 0 of
    each field, as the host path pads)."""
    m, packed = ids.shape[0], self._packed[size]
    ids_view, dense_view = packed_views(packed, self.num_fields)
    with self._lock:
      ids_view[:m] = ids
      dense_view[:m] = dense
      if m < size:
        packed[m:] = 0.0  # float zeros are int32 zeros too
      return np.asarray(self.programs[size](params, self.table, packed))[:m]

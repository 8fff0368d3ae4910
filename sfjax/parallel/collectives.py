"""Bytes moved by the collectives of a compiled program, read from its HLO text.

`compiled.as_text()` (after `jax.jit(f).lower(...).compile()`) lists every
cross-device collective XLA kept. For each we count, per participating device:

  operand bytes   the data the device contributes (all-reduce, all-to-all and
                  collective-permute: the result's size; all-gather: result / group;
                  reduce-scatter: result * group)
  ring bytes      what a bandwidth-optimal ring sends per device: all-reduce
                  2 (G-1)/G N, all-gather and reduce-scatter (G-1)/G N_full,
                  all-to-all (G-1)/G N, collective-permute N

where N is the operand size and G the group size. Async pairs (`*-start` / `*-done`,
as on GPUs) are counted once, at the start; an async all-gather's or
collective-permute's result tuple holds its operands first, which are skipped.
Collectives over a group of one device (a 1-device mesh) move nothing and are skipped.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"f64": 8, "s64": 8, "u64": 8, "c64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2,
          "f16": 2, "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1, "c128": 16,
          "f8e4m3fn": 1, "f8e5m2": 1}
_OP = re.compile(r"=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<op>" + "|".join(KINDS) +
                 r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([0-9,]*)\}")


class _Collective(NamedTuple):
  """One collective of a program.

  Attributes:
    kind: one of KINDS.
    result_bytes: bytes of its result on one device.
    operand_bytes: bytes one device contributes.
    ring_bytes: bytes one device sends in a bandwidth-optimal ring.
    group_size: devices taking part.
  """

  kind: str
  result_bytes: int
  operand_bytes: int
  ring_bytes: float
  group_size: int


def _array_bytes(shape_text: str) -> list[int]:
  """Bytes of each array in an HLO shape (`f32[8,4]{1,0}` or a tuple of them)."""
  out = []
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype not in _BYTES:
      continue
    size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
    out.append(size * _BYTES[dtype])
  return out


def _group_size(line: str, default: int) -> int:
  m = _IOTA_GROUPS.search(line)
  if m:
    return int(m.group(2))
  m = _LIST_GROUPS.search(line)
  if m:
    return len([x for x in m.group(1).split(",") if x])
  return default


def _parse_collectives(hlo_text: str, num_devices: int) -> list[_Collective]:
  """Every collective in `hlo_text`, sized per device.

  Args:
    hlo_text: a compiled program's HLO (`compiled.as_text()`).
    num_devices: the group size of collectives whose replica groups are written in
      the mesh form (`mesh['axis_0'=8]`), i.e. over the whole 1-D mesh.

  Returns:
    The collectives in program order.
  """
  found = []
  for line in hlo_text.splitlines():
    m = _OP.search(line)
    if not m:
      continue
    kind, is_async = m.group("op"), bool(m.group("start"))
    arrays = _array_bytes(m.group("shape"))
    if is_async and kind in ("all-gather", "collective-permute"):
      arrays = arrays[len(arrays) // 2:]  # (operands..., results...[, contexts])
    result = int(sum(arrays))
    g = max(1, _group_size(line, num_devices))
    if g == 1:
      continue  # a collective over one device moves nothing
    operand = {"all-gather": result // g, "reduce-scatter": result * g}.get(kind, result)
    frac = (g - 1) / g
    ring = {"all-reduce": 2 * frac * operand, "all-gather": frac * result,
            "reduce-scatter": frac * operand, "all-to-all": frac * operand,
            "collective-permute": float(operand)}[kind]
    found.append(_Collective(kind, result, operand, ring, g))
  return found


def collective_bytes(hlo_text: str, num_devices: int) -> dict[str, float]:
  """Totals per device: `operand_bytes`, `ring_bytes`, `count` and per kind `<kind>_bytes`
  (operand bytes) of every collective in `hlo_text` (see `_parse_collectives`)."""
  found = _parse_collectives(hlo_text, num_devices)
  out: dict[str, float] = {"count": len(found),
                           "operand_bytes": int(sum(c.operand_bytes for c in found)),
                           "ring_bytes": float(sum(c.ring_bytes for c in found))}
  for kind in KINDS:
    out[f"{kind}_bytes"] = int(sum(c.operand_bytes for c in found if c.kind == kind))
  return out

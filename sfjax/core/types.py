"""The per-step device input shared by the embedding backends, the mesh rules and the step.

After Virtual Sparse Ids (`sfjax.embedding.vsi`) the device sees only int32 rows
(or cache slots) and virtual ids, never raw (possibly 64-bit) feature ids
(DESIGN.md §6.6).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class DeviceBatch(NamedTuple):
  """One step's inputs, fixed shapes.

  Attributes:
    rows: [U] int32 table rows (or cache slots) of the batch's unique ids; padding = V.
    vids: [B, F] int32 virtual ids into `rows`.
    dense: [B, Nd] float32.
    labels: [B] float32.
    mask: [B] float32, 0 for padding examples.
    weights: None (one id per field, weight 1), or [B, S] float32 per-id weights of a
      feature layout's S id columns (0 in padding columns; `vids` is then [B, S]),
      pooled into fields by the model's input wrapper (`sfjax.models.behavior.pooling`).
    row_tables: None (every row updated alike), or [U] int32 table index of each entry
      of `rows`, in the same order (padding entries: any table), for a row optimizer
      whose tables differ (`row_optimizers.per_table`).
  """

  rows: Any
  vids: Any
  dense: Any
  labels: Any
  mask: Any
  weights: Any = None
  row_tables: Any = None

"""Criteo display-advertising logs (Kaggle / Terabyte TSV layout).

One example per line, 40 tab-separated fields and no header:
`label \\t I1..I13 \\t C1..C26`. The label is 0 or 1. I1..I13 are integer
counts, C1..C26 categorical values (usually 8 hex characters, kept as raw
bytes and hashed or looked up by `feature_map`). Any feature may be empty.

Defined transforms:
  * dense: x -> sign(x) * log(1 + |x|), i.e. log(1+x) for the usual x >= 0 and
    an odd-symmetric extension for the few negatives (I2 has -1, -2, -3);
    missing -> 0.0 (the same as x = 0).
  * categorical: missing -> the empty value b'', which has its own row.

Hostile input: I1..I13 are integer counts, so 'nan', 'inf', '1.5' or a value
outside int64 is a bad line (a `DataFormatError` naming file and line, or a
counted, dropped line with `skip_bad_lines`), never a NaN/inf feature: every
dense value is finite, |value| <= log(1 + 2**63) ~ 43.7. Python's integer
syntax is accepted (surrounding whitespace, '+', '_' between digits). A label
other than exactly '0' or '1' is a bad line, and so is a line holding a NUL
byte (`text_io`).
"""

from __future__ import annotations

import io

import numpy as np

from sfjax.data import text_io

NUM_DENSE = 13
NUM_CATEGORICAL = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_CATEGORICAL
_DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
_FIELD_NAMES = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))


def _parse_criteo_lines(chunk: text_io.LineChunk,
                        skip_bad_lines: bool) -> tuple[text_io.RawChunk, int]:
  """Parses Criteo lines.

  Args:
    chunk: lines of one file.
    skip_bad_lines: drop malformed lines instead of raising.

  Returns:
    (raw, num_bad): raw.values [n, 26] bytes, raw.dense [n, 13] float32,
    raw.labels [n] float32; num_bad lines were dropped.

  Raises:
    DataFormatError: wrong field count, label not 0/1, or a non-integer I
      field, naming file and line (unless `skip_bad_lines`).
  """
  problems: dict[int, str] = {}
  fields, rows = text_io.split_fields(chunk, b"\t", NUM_COLUMNS, problems)
  labels = text_io.parse_labels(fields[:, 0], rows, "label", problems)
  ints = text_io.parse_int_columns(fields[:, 1:1 + NUM_DENSE], rows, _DENSE_NAMES, problems)
  keep, num_bad = text_io.keep_good_rows(problems, chunk, rows, skip_bad_lines)
  values = np.ascontiguousarray(fields[keep, 1 + NUM_DENSE:])
  return text_io.RawChunk(values, text_io.signed_log1p(ints[keep]), labels[keep]), num_bad


class CriteoFormat:
  """`text_io.LineFormat` for Criteo TSV files (no header)."""

  field_names = _FIELD_NAMES
  num_dense = NUM_DENSE

  def start_file(self, f: io.BufferedIOBase, path: str) -> tuple[text_io.ChunkParser, int]:
    """Criteo files have no header: data starts at line 1."""
    del f, path
    return _parse_criteo_lines, 1

"""Avazu mobile-ads click logs (Kaggle CSV layout).

Comma-separated, with a header naming the columns:
`id, click, hour, C1, banner_pos, site_id, site_domain, site_category, app_id,
app_domain, app_category, device_id, device_ip, device_model, device_type,
device_conn_type, C14..C21`. Columns are located by the header of each file,
so their order may vary; `id` and unknown columns are ignored. Quoted fields
are not supported (Avazu has none): a comma inside a value is a field-count
error.

Examples get 23 categorical fields and no dense feature: the 21 categorical
columns in the order above, then `hour_of_day` (b'00'..b'23') and
`day_of_week` (b'0' = Monday .. b'6'), both derived from `hour` (YYMMDDHH,
year 20YY). Missing values (empty fields) are the value b''.

Hostile input: a `click` other than exactly '0' or '1', an `hour` that is not a
valid YYMMDDHH date, a wrong field count or a NUL byte make a bad line (a
`DataFormatError` naming file and line, or a counted, dropped line with
`skip_bad_lines`). Categorical values are opaque bytes (any encoding). A file
of 0 bytes has no header and no examples; a non-empty file must start with
the header.
"""

from __future__ import annotations

import datetime
import io
from typing import NamedTuple

import numpy as np

from sfjax.core.errors import DataFormatError
from sfjax.data import text_io

_LABEL_COLUMN = "click"
_HOUR_COLUMN = "hour"
CATEGORICAL_COLUMNS = (
    "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
    "app_category", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
    "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21")
_FIELD_NAMES: tuple[str, ...] = CATEGORICAL_COLUMNS + ("hour_of_day", "day_of_week")
_NUM_DENSE = 0


def split_hour(hour: bytes) -> tuple[bytes, bytes]:
  """YYMMDDHH -> (hour of day b'HH', day of week b'0'..b'6', Monday = 0).

  Raises:
    ValueError: not 8 digits or not a valid date and hour.
  """
  if len(hour) != 8 or not hour.isdigit():
    raise ValueError(f"hour must be YYMMDDHH (8 digits), got {hour.decode(errors='replace')!r}")
  yy, mm, dd, hh = (int(hour[i:i + 2]) for i in range(0, 8, 2))
  if hh > 23:
    raise ValueError(f"hour of day {hh} > 23 in hour {hour.decode()!r}")
  try:
    weekday = datetime.date(2000 + yy, mm, dd).weekday()
  except ValueError as e:
    raise ValueError(f"invalid date in hour {hour.decode()!r}: {e}") from None
  return hour[6:8], str(weekday).encode()


def _hour_fields(column: np.ndarray, rows: np.ndarray,
                 problems: dict[int, str]) -> np.ndarray:
  """[m] YYMMDDHH bytes -> [m, 2] bytes (hour of day, day of week)."""
  out = np.full((column.shape[0], 2), b"", dtype="S2")
  if column.shape[0] == 0:
    return out
  # A log spans few distinct hours: convert each distinct value once.
  uniq, inverse = np.unique(column, return_inverse=True)
  table = np.full((uniq.shape[0], 2), b"", dtype="S2")
  for u, value in enumerate(uniq):
    try:
      table[u] = split_hour(bytes(value))
    except ValueError as e:
      for i in np.flatnonzero(inverse == u):
        problems.setdefault(int(rows[i]), str(e))
  return table[inverse]


class AvazuColumns(NamedTuple):
  """Column positions in one file, from its header."""

  num_columns: int
  label: int
  hour: int
  categorical: np.ndarray  # [21] int64, in CATEGORICAL_COLUMNS order


def parse_header(header: bytes, path: str) -> AvazuColumns:
  """Locates the columns; raises `DataFormatError(path, 1, ...)` if one is missing."""
  names = [n.strip().decode("utf-8", errors="replace").lstrip("\ufeff")
           for n in header.rstrip(b"\r\n").split(b",")]
  index: dict[str, int] = {}
  for i, name in enumerate(names):
    index.setdefault(name, i)
  missing = [c for c in (_LABEL_COLUMN, _HOUR_COLUMN) + CATEGORICAL_COLUMNS if c not in index]
  if missing:
    raise DataFormatError(path, 1, f"header lacks required column(s) {', '.join(missing)}")
  categorical = np.asarray([index[c] for c in CATEGORICAL_COLUMNS], dtype=np.int64)
  return AvazuColumns(len(names), index[_LABEL_COLUMN], index[_HOUR_COLUMN], categorical)


class _AvazuParser:
  """Parses the data lines of one Avazu file."""

  def __init__(self, columns: AvazuColumns):
    self.columns = columns

  def __call__(self, chunk: text_io.LineChunk,
               skip_bad_lines: bool) -> tuple[text_io.RawChunk, int]:
    """Lines -> (RawChunk with values [n, 23], dense [n, 0], labels [n]; num_bad)."""
    problems: dict[int, str] = {}
    cols = self.columns
    fields, rows = text_io.split_fields(chunk, b",", cols.num_columns, problems)
    labels = text_io.parse_labels(fields[:, cols.label], rows, _LABEL_COLUMN, problems)
    hours = _hour_fields(fields[:, cols.hour], rows, problems)
    keep, num_bad = text_io.keep_good_rows(problems, chunk, rows, skip_bad_lines)
    categorical = fields[keep][:, cols.categorical]
    values = np.concatenate([categorical, hours[keep]], axis=1)  # Widens to the longer 'S'.
    dense = np.zeros((values.shape[0], 0), dtype=np.float32)
    return text_io.RawChunk(values, dense, labels[keep]), num_bad


class AvazuFormat:
  """`text_io.LineFormat` for Avazu CSV files (header on line 1)."""

  field_names = _FIELD_NAMES
  num_dense = _NUM_DENSE

  def start_file(self, f: io.BufferedIOBase, path: str) -> tuple[text_io.ChunkParser, int]:
    """Reads the header; data lines are numbered from 2."""
    header = f.readline(text_io.MAX_LINE_BYTES + 1)
    if len(header) > text_io.MAX_LINE_BYTES:
      raise DataFormatError(path, 1, f"header is longer than {text_io.MAX_LINE_BYTES} bytes: not "
                            "a CSV file?")
    if not header.strip():
      raise DataFormatError(path, 1, "expected a CSV header, got an empty line")
    return _AvazuParser(parse_header(header, path)), 2

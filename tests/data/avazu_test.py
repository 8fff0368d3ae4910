"""Tests for sfjax.data.avazu: header handling, hour split, malformed lines."""

import datetime

import numpy as np
import pytest

from sfjax.core.errors import DataFormatError
from sfjax.data import avazu, text_io

HEADER = ["id", "click", "hour"] + list(avazu.CATEGORICAL_COLUMNS)


def _row(click="0", hour="14102100", ident="1000009418151094273", prefix="v"):
  values = {"id": ident, "click": click, "hour": hour}
  values.update({c: f"{prefix}{i}" for i, c in enumerate(avazu.CATEGORICAL_COLUMNS)})
  return values


def _write(path, rows, header=HEADER):
  lines = [",".join(header)] + [",".join(r[c] for c in header) for r in rows]
  path.write_text("\n".join(lines) + "\n")
  return str(path)


def _read(paths, skip=False):
  reader = text_io.TextReader(paths, avazu.AvazuFormat(), skip, chunk_lines=2)
  raws = list(reader)
  return (np.concatenate([r.values for r in raws]), np.concatenate([r.dense for r in raws]),
          np.concatenate([r.labels for r in raws]), reader)


def test_split_hour_matches_the_calendar():
  assert avazu.split_hour(b"14102100") == (b"00", b"1")  # 2014-10-21 was a Tuesday.
  for day in range(21, 31):
    hh, dow = avazu.split_hour(f"1410{day}17".encode())
    assert hh == b"17"
    assert int(dow) == datetime.date(2014, 10, day).weekday()


@pytest.mark.parametrize("hour", [b"1410210", b"14x02100", b"14102124", b"14133100", b"14022900"])
def test_split_hour_rejects_bad_values(hour):
  with pytest.raises(ValueError, match="hour"):
    avazu.split_hour(hour)


def test_columns_are_found_by_header_and_hour_becomes_two_fields(tmp_path):
  header = list(reversed(HEADER)) + ["extra"]  # Any column order; unknown columns ignored.
  rows = [_row("1", "14102100"), _row("0", "14102523", prefix="w")]
  for r in rows:
    r["extra"] = "zzz"
  values, dense, labels, _ = _read([_write(tmp_path / "train.csv", rows, header)])
  assert values.shape == (2, 23) and len(avazu._FIELD_NAMES) == 23
  assert dense.shape == (2, 0)
  np.testing.assert_array_equal(labels, [1, 0])
  assert values[0, :21].tolist() == [f"v{i}".encode() for i in range(21)]
  assert values[1, 2] == b"w2"  # site_id
  assert values[:, 21:].tolist() == [[b"00", b"1"], [b"23", b"5"]]  # 2014-10-25: Saturday.
  assert b"zzz" not in values and b"1000009418151094273" not in values


def test_missing_column_is_reported_at_line_1(tmp_path):
  header = [c for c in HEADER if c not in ("hour", "C18")]
  path = _write(tmp_path / "t.csv", [], header)
  expected = rf"{path}:1: header lacks required column\(s\) hour, C18"
  with pytest.raises(DataFormatError, match=expected):
    _read([path])


def test_a_blank_header_line_is_reported(tmp_path):
  path = tmp_path / "t.csv"
  path.write_text("\n" + ",".join(HEADER) + "\n")
  with pytest.raises(DataFormatError, match=r"t.csv:1: expected a CSV header"):
    _read([str(path)])


def test_a_0_byte_file_has_no_examples_and_no_header(tmp_path):
  empty = tmp_path / "a.csv"
  empty.write_bytes(b"")
  full = _write(tmp_path / "b.csv", [_row(click="1")])
  reader = text_io.TextReader([str(empty)], avazu.AvazuFormat())
  assert list(reader) == [] and not reader.has_data_lines()
  _, _, labels, reader = _read([str(empty), full])  # An empty part of a glob is harmless.
  assert labels.tolist() == [1.0] and reader.bad_lines == 0


def test_a_header_only_file_has_no_data_lines(tmp_path):
  path = _write(tmp_path / "h.csv", [])
  assert not text_io.TextReader([path], avazu.AvazuFormat()).has_data_lines()


@pytest.mark.parametrize("row, reason", [
    (_row(hour="14102199"), "hour of day 99 > 23"),
    (_row(hour="2014102100"), "YYMMDDHH"),
    (_row(click="1.0"), "click must be 0 or 1, got '1.0'"),
])
def test_malformed_values_name_file_and_line(tmp_path, row, reason):
  path = _write(tmp_path / "t.csv", [_row(), _row(), row])
  with pytest.raises(DataFormatError, match=reason) as e:
    _read([path])
  assert (e.value.path, e.value.line) == (path, 4)  # The header is line 1.


def test_wrong_field_count_and_skip_bad_lines(tmp_path):
  path = _write(tmp_path / "t.csv", [_row(), _row(click="7"), _row(hour="x"), _row("1")])
  with open(path, "a") as f:
    f.write("1,2,3\n")
  with pytest.raises(DataFormatError, match=r"t.csv:3: click"):
    _read([path])
  _, _, labels, reader = _read([path], skip=True)
  np.testing.assert_array_equal(labels, [0, 1])
  assert reader.bad_lines == 3

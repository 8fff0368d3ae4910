"""Hostile input to the Criteo (TSV) and Avazu (CSV) readers, property-based and bounded.

Any bytes written to a file (.gz or not) either give rows that a small reference
parser below also accepts, value for value, or a `DataFormatError` naming that
file and a 1-based line; with `skip_bad_lines` the reference's bad lines are
counted instead. Nothing else may escape: no other exception, no hang (lines are
read with a bound), no silent garbage (labels 0/1, finite dense, ids in range).
"""

import functools
import gzip
import os
import tempfile

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core.errors import DataFormatError
from sfjax.data import avazu, criteo, dataset, feature_map, text_io

MAX_LINE = 600  # The readers' line bound in these tests (the default is 1 MiB).
SETTINGS = hypothesis.settings(
    max_examples=150, deadline=2000, derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow])

# ---- a reference parser, one line at a time ---------------------------------


def _int64(text: bytes):
  """The dense rule: b'' -> 0; else a Python int in int64 range; None when bad."""
  if text == b"":
    return 0
  try:
    value = int(text)
  except ValueError:
    return None
  return value if -2**63 <= value < 2**63 else None


def _criteo_row(line: bytes):
  """(label, dense ints, categorical values) of a good Criteo line, else None."""
  if b"\0" in line:
    return None
  fields = line.rstrip(b"\r\n").split(b"\t")
  if len(fields) != criteo.NUM_COLUMNS or fields[0] not in (b"0", b"1"):
    return None
  ints = [_int64(t) for t in fields[1:1 + criteo.NUM_DENSE]]
  if any(v is None for v in ints):
    return None
  return int(fields[0]), ints, fields[1 + criteo.NUM_DENSE:]


_AVAZU_HEADER = ["id", "click", "hour"] + list(avazu.CATEGORICAL_COLUMNS)


def _avazu_row(line: bytes, columns: avazu.AvazuColumns):
  """(label, [], 23 values) of a good Avazu line, else None."""
  if b"\0" in line:
    return None
  fields = line.rstrip(b"\r\n").split(b",")
  if len(fields) != columns.num_columns or fields[columns.label] not in (b"0", b"1"):
    return None
  try:
    hour_fields = avazu.split_hour(fields[columns.hour])
  except ValueError:
    return None
  values = [fields[i] for i in columns.categorical] + list(hour_fields)
  return int(fields[columns.label]), [], values


FORMATS = {
    "criteo": (criteo.CriteoFormat, _criteo_row, 0),
    "avazu": (avazu.AvazuFormat, _avazu_row, 1),  # (format, reference, header lines)
}


def _split_after_newline(content: bytes):
  start = 0
  while start < len(content):
    end = content.find(b"\n", start)
    end = len(content) if end < 0 else end + 1
    yield content[start:end]
    start = end


def _expected(fmt: str, content: bytes, skip: bool):
  """('rows', rows, num_bad) or ('error', line) of the reference on a plain file."""
  _, reference, header = FORMATS[fmt]
  lines = list(_split_after_newline(content))
  if header and lines:
    try:  # The header rules are avazu_test's subject; here it only has to be found or not.
      columns = avazu.parse_header(lines[0], "reference")
    except DataFormatError:
      return ("error", 1)
    reference = functools.partial(reference, columns=columns)
  rows, bad = [], 0
  for number, line in enumerate(lines[header:], start=header + 1):
    if len(line) > MAX_LINE:
      return ("error", number)
    row = reference(line)
    if row is None:
      if not skip:
        return ("error", number)
      bad += 1
    else:
      rows.append(row)
  return ("rows", rows, bad)


# ---- hostile file contents ---------------------------------------------------

def _mostly(good, hostile):
  """`good` 15 times in 16, else `hostile`: lines stay mostly parseable, so rows come out."""
  return st.integers(0, 15).flatmap(lambda k: hostile if k == 0 else good)


_DENSE = _mostly(
    st.sampled_from([b"", b"0", b"7", b"-3"]) | st.integers(-2**63, 2**63 - 1).map(
        lambda v: str(v).encode()),
    st.sampled_from([b"+5", b" 5", b"1_0", b"nan", b"inf", b"-inf", b"NaN", b"1.5", b"1e3",
                     b"0x10", b"\x0c5", b"\xff", b"\xd9\xa5", b"9223372036854775808",
                     b"-9223372036854775809", b"99999999999999999999"]) | st.binary(max_size=3))
_VALUE = _mostly(st.sampled_from([b"", b"68fd1e64", b"a\rb", b"\xff\xfe", b"x" * 30]),
                 st.binary(max_size=6))
_LABEL = _mostly(st.sampled_from([b"0", b"1"]),
                 st.sampled_from([b"2", b"", b"-1", b" 1", b"1.0", b"nan", b"true"]))
_HOUR = _mostly(st.sampled_from([b"14102100", b"14102123", b"16022915"]),
                st.sampled_from([b"14102199", b"14023000", b"1410210", b"", b"abcdefgh"]))
_END = _mostly(st.sampled_from([b"\n", b"\r\n"]), st.sampled_from([b"\r\r\n", b"\n\n", b"\r"]))


@st.composite
def _criteo_line(draw):
  fields = ([draw(_LABEL)] + [draw(_DENSE) for _ in range(criteo.NUM_DENSE)]
            + [draw(_VALUE) for _ in range(criteo.NUM_CATEGORICAL)])
  if draw(st.integers(0, 15)) == 0:  # A wrong field count.
    del fields[draw(st.integers(0, len(fields) - 1))]
  return b"\t".join(fields) + draw(_END)


@st.composite
def _avazu_line(draw):
  fields = ([draw(st.sampled_from([b"1", b"", b"\xff"])), draw(_LABEL), draw(_HOUR)]
            + [draw(_VALUE.map(lambda v: v.replace(b",", b";")))
               for _ in range(len(avazu.CATEGORICAL_COLUMNS))])
  if draw(st.integers(0, 15)) == 0:
    fields.append(b"extra")
  return b",".join(fields) + draw(_END)


_NOISE = st.one_of(
    st.binary(max_size=200),  # Random binary.
    st.sampled_from([b"\0" * 64, b"\n", b"\r\n", b"\t" * 39 + b"\n", b"x" * (MAX_LINE + 5),
                     b"\xef\xbb\xbf", b"\x1f\x8b\x08\x00"]))


@st.composite
def _content(draw, fmt: str):
  line = _criteo_line() if fmt == "criteo" else _avazu_line()
  pieces = draw(st.lists(_mostly(line, _NOISE), max_size=12))
  body = b"".join(pieces)
  if fmt == "avazu" and draw(st.integers(0, 7)):
    body = ",".join(_AVAZU_HEADER).encode() + draw(_END) + body
  if body and draw(st.booleans()):  # A partial line (or cut anywhere) at EOF.
    body = body[:draw(st.integers(0, len(body)))]
  return body


def _read(path: str, fmt: str, skip: bool):
  make_format = FORMATS[fmt][0]
  reader = text_io.TextReader([path], make_format(), skip, chunk_lines=3, max_line_bytes=MAX_LINE)
  return list(reader), reader


def _check_rows(raws, fmt: str, expected_rows):
  """The reader's rows equal the reference's, and carry no garbage."""
  make_format = FORMATS[fmt][0]
  num_fields, num_dense = len(make_format().field_names), make_format().num_dense
  for raw in raws:
    assert raw.values.dtype.kind == "S" and raw.values.shape[1] == num_fields
    assert raw.dense.dtype == np.float32 and raw.dense.shape == (raw.labels.shape[0], num_dense)
    assert np.isfinite(raw.dense).all()
    assert np.isin(raw.labels, [0.0, 1.0]).all()
  labels = [float(lab) for raw in raws for lab in raw.labels]
  assert labels == [float(r[0]) for r in expected_rows]
  values = [list(v) for raw in raws for v in raw.values]
  # numpy 'S' arrays drop trailing NULs; lines with a NUL are bad, so none is lost here.
  assert values == [list(r[2]) for r in expected_rows]
  if num_dense and expected_rows:
    dense = np.concatenate([raw.dense for raw in raws])
    want = text_io.signed_log1p(np.array([r[1] for r in expected_rows], dtype=np.int64))
    np.testing.assert_array_equal(dense, want)


# Criteo in the fast tier; Avazu (tests/data/avazu_test.py in the fast tier) in `make test-all`.
FMT_CASES = ["criteo", pytest.param("avazu", marks=pytest.mark.slow)]


@pytest.mark.parametrize("fmt", FMT_CASES)
@SETTINGS
@hypothesis.given(data=st.data(), skip=st.booleans())
def test_any_plain_file_gives_the_reference_rows_or_names_file_and_line(fmt, data, skip):
  content = data.draw(_content(fmt))
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, f"part.{fmt}")
    with open(path, "wb") as f:
      f.write(content)
    want = _expected(fmt, content, skip)
    try:
      raws, reader = _read(path, fmt, skip)
    except DataFormatError as e:
      hypothesis.event("error")
      assert want[0] == "error", f"reader raised {e}, reference accepts the file"
      assert (e.path, e.line) == (path, want[1]) and str(e).startswith(f"{path}:{e.line}: ")
      return
    hypothesis.event(f"rows, {'some' if want[1] else 'none'}, {'skip' if skip else 'strict'}")
    assert want[0] == "rows", f"reader accepted the file, reference fails at line {want[1]}"
    _check_rows(raws, fmt, want[1])
    assert reader.bad_lines == want[2] and (skip or want[2] == 0)


@pytest.mark.parametrize("fmt", FMT_CASES)
@SETTINGS
@hypothesis.given(data=st.data(), damage=st.sampled_from(["none", "cut", "flip", "raw"]),
                  where=st.floats(0, 1), skip=st.booleans())
def test_any_gzip_damage_gives_the_rows_or_names_file_and_line(fmt, data, damage, where, skip):
  content = data.draw(_content(fmt))
  packed = gzip.compress(content, mtime=0) if damage != "raw" else content
  at = min(int(where * len(packed)), len(packed) - 1)
  if damage == "cut":
    packed = packed[:at]
  elif damage == "flip":
    packed = packed[:at] + bytes([packed[at] ^ 0x5A]) + packed[at + 1:]
  want = _expected(fmt, content, skip)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, f"part.{fmt}.gz")
    with open(path, "wb") as f:
      f.write(packed)
    try:
      raws, reader = _read(path, fmt, skip)
    except DataFormatError as e:
      hypothesis.event(f"error, {damage}")
      assert e.path == path and e.line >= 1 and str(e).startswith(f"{path}:{e.line}: ")
      if damage == "cut":  # A prefix of the content: at most one line past its lines.
        assert e.line <= content.count(b"\n") + 2
      if damage == "none":
        assert want == ("error", e.line)
      return
    # Read through: the data came back intact (a flip in an unchecked header byte, a cut
    # to 0 bytes = an empty file) and equals the reference's rows.
    if damage == "cut" and not packed or damage == "raw" and not content:
      assert raws == []
      return
    hypothesis.event(f"rows, {damage}")
    assert want[0] == "rows"
    _check_rows(raws, fmt, want[1])
    assert reader.bad_lines == want[2]


@pytest.mark.parametrize("fmt", ["criteo", "avazu"])
@pytest.mark.parametrize("hash_rows", [0, 97])
@hypothesis.settings(SETTINGS, max_examples=40)
@hypothesis.given(data=st.data(), skip=st.booleans())
def test_any_file_through_make_dataset_gives_in_range_batches_or_a_clear_error(
    fmt, hash_rows, data, skip):
  content = data.draw(_content(fmt))
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, f"part.{fmt}")
    with open(path, "wb") as f:
      f.write(content)
    cfg = ctr.get_config().data
    cfg.format, cfg.train_path, cfg.eval_path = fmt, path, path
    cfg.hash_rows, cfg.skip_bad_lines, cfg.shuffle_buffer = hash_rows, skip, 4
    try:
      ds = dataset.make_dataset(cfg, seed=0)
      rows = np.asarray(ds.spec.field_rows)
      batches = list(ds.eval_batches("eval", 8))
      train = ds.train_batches(8, seed=0)
      batches += [next(train) for _ in range(3)]
    except DataFormatError as e:
      hypothesis.event("error")
      assert e.path == path and str(e).startswith(f"{path}:{e.line}: ") and e.line >= 1
      return
    except ValueError as e:  # Only the "no examples" error of a split may be a plain one.
      hypothesis.event("no examples")
      assert type(e) is ValueError and "has no examples" in str(e), e
      assert str(e).startswith(("data.train_path: ", "data.eval_path: ")), e
      return
    hypothesis.event("batches")
    for b in batches:
      assert ((b.ids >= 0) & (b.ids < rows)).all()
      assert np.isfinite(b.dense).all() and np.isin(b.labels, [0.0, 1.0]).all()
      assert np.isin(b.mask, [0.0, 1.0]).all()


_NO_NUL_VALUE = st.binary(max_size=20).map(lambda v: v.replace(b"\0", b"\1"))  # Text has no NUL.


@SETTINGS
@hypothesis.given(values=st.lists(st.lists(_NO_NUL_VALUE, min_size=3, max_size=3),
                                  min_size=1, max_size=30),
                  num_rows=st.integers(1, 2**40), min_count=st.integers(1, 3))
def test_mapped_ids_are_always_in_the_table(values, num_rows, min_count):
  array = np.array(values, dtype=bytes)
  ids = feature_map.HashingMapper(num_rows)(array)
  assert ((ids >= 0) & (ids < num_rows)).all()
  vocab = feature_map.build_vocabulary([array[: len(values) // 2]], 3, min_count)
  ids = vocab(array)  # Half of the values were never seen: they map to the OOV row 0.
  assert ((ids >= 0) & (ids < np.asarray(vocab.field_rows))).all()
  keys, seen = feature_map.value_keys(array), feature_map.value_keys(array[: len(values) // 2])
  for f in range(3):
    assert (ids[~np.isin(keys[:, f], seen[:, f]), f] == 0).all()

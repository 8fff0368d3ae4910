"""The Parquet reader: columns, lists as padded ids + weights, bad input, text equivalence."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments.configs import ctr
from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError, DataFormatError
from sfjax.data import dataset, feature_map, parquet, preprocessed
from sfjax.data.generated import synthetic
from sfjax.train import defaults, loop


def _table(**overrides):
  columns = {
      "label": pa.array([0, 1, 1, 0], pa.int64()),
      "user": pa.array(["a", "b", "a", "c"]),
      "item_id": pa.array([1, 2, 3, 2], pa.int64()),
      "price": pa.array([1.0, 2.0, 3.5, -1.0]),
      "history": pa.array([[1, 2, 3], [], [3, 2, 1, 5, 7], [9]], pa.list_(pa.int64())),
      "tags": pa.array([["x"], ["y", "z", "y"], [], ["x", "x"]]),
      "tw": pa.array([[0.5], [1.0, 2.0, 4.0], [], [1.0, 3.0]]),
  }
  columns.update(overrides)
  return pa.table(columns)


def _config(path, **parquet_fields):
  c = defaults.ctr_defaults().data
  c.format, c.train_path, c.eval_path = "parquet", str(path), str(path)
  c.parquet.dense = "price"
  c.hash_rows = 1000  # no vocabulary pass at construction: bad rows meet the reader later
  for key, value in parquet_fields.items():
    c.parquet[key] = value
  return c


def _write(tmp_path, table, name="a.parquet", row_group_size=2):
  path = tmp_path / name
  pq.write_table(table, path, row_group_size=row_group_size)
  return path


_BAGS = {"bags": "history:sequence:3,tags:multi_hot:2:sqrtn:tw", "shared_tables": "history=item_id"}


def test_scalar_columns_map_like_the_text_formats(tmp_path):
  path = _write(tmp_path, _table(), row_group_size=3)
  c = _config(path, categorical="user,item_id")
  c.hash_rows = 0
  ds = dataset.make_dataset(c, 0)
  assert ds.spec.layout is None and ds.spec.num_dense == 1
  batch = next(ds.chunks("train"))
  assert batch.weights is None and batch.ids.shape == (3, 2)
  # An int's decimal digits, a string's bytes: the vocabulary the text formats would build.
  values = np.array([[b"a", b"1"], [b"b", b"2"], [b"a", b"3"], [b"c", b"2"]])
  text_vocab = feature_map.build_vocabulary([values], 2)
  assert ds.spec.field_rows == text_vocab.field_rows == (4, 4)
  np.testing.assert_array_equal(batch.ids, text_vocab(values[:3]))
  np.testing.assert_array_equal(batch.dense[:, 0], [1.0, 2.0, 3.5])
  np.testing.assert_array_equal(batch.labels, [0, 1, 1])


def test_default_categorical_is_every_other_scalar_column(tmp_path):
  path = _write(tmp_path, _table())
  ds = dataset.make_dataset(_config(path, **_BAGS), 0)
  assert [f.name for f in ds.spec.layout.features] == ["user", "item_id", "history", "tags"]


def test_list_columns_become_padded_ids_and_weights(tmp_path):
  path = _write(tmp_path, _table())
  ds = dataset.make_dataset(_config(path, **_BAGS), 0)
  layout = ds.spec.layout
  assert [t.name for t in layout.tables] == ["user", "item_id", "tags"]
  assert layout.features[2] == fl.FeatureSpec("history", "item_id", "sequence", 3, "mean")
  assert layout.features[3] == fl.FeatureSpec("tags", "tags", "multi_hot", 2, "sqrtn", True)
  assert ds.spec.num_columns == 7 and ds.spec.field_rows == (1000,) * 4
  batch = next(ds.eval_batches("eval", 4))
  item = {v: ds.mapper.rows_of_keys(feature_map.value_keys(np.array([[str(v).encode()]]),
                                                           feature_map.field_salts(3)[1:2]), 1)[0, 0]
          for v in (1, 2, 3, 5, 7, 9)}
  np.testing.assert_array_equal(batch.ids[:, 1], [item[1], item[2], item[3], item[2]])
  # The history reads the item table; the sequence keeps its LAST 3 ids, left-aligned.
  np.testing.assert_array_equal(batch.ids[:, 2:5], [[item[1], item[2], item[3]], [-1, -1, -1],
                                                    [item[1], item[5], item[7]], [item[9], -1, -1]])
  np.testing.assert_array_equal(batch.weights[:, 2:5], [[1, 1, 1], [0, 0, 0], [1, 1, 1], [1, 0, 0]])
  # The bag keeps its FIRST 2 ids with their weights; duplicates stay (a bag is a multiset).
  np.testing.assert_array_equal(batch.weights[:, 5:], [[0.5, 0], [1, 2], [0, 0], [1, 3]])
  assert batch.ids[3, 5] == batch.ids[3, 6] and batch.ids[2, 5] == -1
  assert batch.ids[1, 5] != batch.ids[1, 6]
  assert ds.stats["truncated_ids_by_split"]["eval"] == 2 + 1  # history row 2: 2, tags row 1: 1


def test_streams_by_row_group_and_files_in_order(tmp_path):
  rows = 50
  table = _table(label=pa.array(np.arange(rows) % 2), user=pa.array([str(i) for i in range(rows)]),
                 item_id=pa.array(np.arange(rows)), price=pa.array(np.arange(rows, dtype=float)),
                 history=pa.array([[i] for i in range(rows)]), tags=pa.array([["t"]] * rows),
                 tw=pa.array([[1.0]] * rows))
  _write(tmp_path, table.slice(0, 30), "p0.parquet", row_group_size=7)
  _write(tmp_path, table.slice(30), "p1.parquet", row_group_size=7)
  assert pq.ParquetFile(tmp_path / "p0.parquet").num_row_groups == 5
  ds = parquet.ParquetDataset(_config(f"{tmp_path}/p*.parquet", **_BAGS), chunk_rows=4)
  chunks = list(ds.chunks("train"))
  # A record batch never straddles a row group: 7 = 4 + 3 per group, the last groups shorter.
  assert [c.size for c in chunks][:4] == [4, 3, 4, 3] and max(c.size for c in chunks) == 4
  dense = np.concatenate([c.dense[:, 0] for c in chunks])
  np.testing.assert_array_equal(dense, np.arange(rows))


@pytest.mark.parametrize("column,value,where", [
    ("user", pa.array(["a", None, "a", "c"]), "row group 0, column 'user': null value"),
    ("history", pa.array([[1], [2], [3, None], [9]]), "row group 1, column 'history': null"),
    ("history", pa.array([[1], [2], None, [9]], pa.list_(pa.int64())), "row group 1, column 'history'"),
    ("price", pa.array([1.0, 2.0, 3.0, float("nan")]), "row group 1, column 'price': dense value is "
     "not finite"),
    ("label", pa.array([0, 2, 1, 0]), "row group 0, column 'label': label must be 0 or 1"),
    ("tw", pa.array([[0.5], [1.0, 2.0, 4.0], [], [1.0]]), "row group 1, column 'tw': number of "
     "weights differs from the ids of 'tags'"),
    ("label", pa.array([0, 1, None, 0], pa.int64()), "row group 1, column 'label': null value"),
    ("label", pa.array([False, None, True, True]), "row group 0, column 'label': null value"),
    ("price", pa.array([1.0, None, 3.0, 2.0]), "row group 0, column 'price': null value"),
    ("tw", pa.array([[0.5], None, [], [1.0, 3.0]], pa.list_(pa.float64())),
     "row group 0, column 'tw': null list or null weight in the list"),
    ("tw", pa.array([[0.5], [1.0, None, 4.0], [], [1.0, 3.0]]),
     "row group 0, column 'tw': null list or null weight in the list"),
    ("tw", pa.array([[0.5], [1.0, float("inf"), 4.0], [], [1.0, 3.0]]),  # row 0's are finite
     "row group 0, column 'tw': weight is not finite"),
])
def test_bad_rows_name_file_row_group_and_column(tmp_path, column, value, where):
  path = _write(tmp_path, _table(**{column: value}))
  ds = dataset.make_dataset(_config(path, **_BAGS), 0)
  with pytest.raises(DataFormatError, match=where) as err:
    list(ds.chunks("train"))
  assert err.value.path == str(path)
  skip = _config(path, **_BAGS)
  skip.skip_bad_lines = True
  ds = dataset.make_dataset(skip, 0)
  assert sum(c.size for c in ds.chunks("train")) == 3 and ds.stats["bad_lines"] == 1


def test_bad_row_error_names_its_row_of_the_file(tmp_path):
  path = _write(tmp_path, _table(user=pa.array(["a", "b", "a", None])))
  with pytest.raises(DataFormatError) as err:
    list(dataset.make_dataset(_config(path, **_BAGS), 0).chunks("train"))
  assert err.value.line == 4 and str(err.value).startswith(f"{path}:4: row group 1, column 'user'")


@pytest.mark.parametrize("table,where", [
    (_table().drop_columns(["price"]), "row group 0, column 'price': missing"),
    (_table(item_id=pa.array([1.5, 2.0, 3.0, 2.0])), "column 'item_id': type double, want a scalar "
     "int or string"),
    (_table(history=pa.array([1, 2, 3, 4])), "column 'history': type int64, want a list<int|string>"),
    (_table(tw=pa.array([["a"], ["b"], [], ["c"]])), "column 'tw': type list<element: string>, want a list<float>"),
])
def test_missing_columns_and_wrong_types_are_named(tmp_path, table, where):
  path = _write(tmp_path, table)
  c = _config(path, categorical="user,item_id", **_BAGS)
  c.skip_bad_lines = True  # never skipped: no row of such a file can be read
  ds = dataset.make_dataset(c, 0)
  with pytest.raises(DataFormatError, match=where):
    list(ds.chunks("train"))


def test_not_a_parquet_file_and_empty_splits(tmp_path):
  bad = tmp_path / "x.parquet"
  bad.write_bytes(b"label,user\n0,a\n")
  with pytest.raises(DataFormatError, match="x.parquet:1: not a readable Parquet file"):
    dataset.make_dataset(_config(bad), 0)
  empty = _write(tmp_path, _table().slice(0, 0), "e.parquet")
  c = _config(_write(tmp_path, _table()))
  c.eval_path = str(empty)
  with pytest.raises(ValueError, match="data.eval_path: split 'eval' has no examples"):
    dataset.make_dataset(c, 0)


def test_keys_per_column_equal_the_text_formats_keys_and_vocabulary():
  values = np.array([[b"a", b"7"], [b"b", b"7"], [b"a", b"x"], [b"", b"7"]])
  keys = feature_map.value_keys(values)
  salts = feature_map.field_salts(2)
  for f in range(2):
    np.testing.assert_array_equal(feature_map.value_keys(values[:, f:f + 1], salts[f:f + 1])[:, 0],
                                  keys[:, f])
  vocab = feature_map.build_vocabulary([values], 2, min_count=2)
  by_keys = feature_map.build_vocabulary_from_keys([[keys[:2, 0], keys[:, 1]], [keys[2:, 0], []]],
                                                   2, min_count=2)
  assert by_keys.field_rows == vocab.field_rows == (2, 2)
  for f in range(2):
    np.testing.assert_array_equal(by_keys.rows_of_keys(keys[:, f], f), vocab(values)[:, f])


def test_shared_table_must_name_a_feature(tmp_path):
  path = _write(tmp_path, _table())
  with pytest.raises(ConfigError, match="data.parquet.shared_tables: history=item: 'item' is not"):
    dataset.make_dataset(_config(path, bags="history:sequence:3,tags:multi_hot:2:sum:tw",
                                 shared_tables="history=item"), 0)


def test_vocabulary_is_shared_by_the_features_of_a_table(tmp_path):
  path = _write(tmp_path, _table())
  c = _config(path, **_BAGS)
  c.hash_rows, c.min_count = 0, 2
  ds = dataset.make_dataset(c, 0)
  # item values: 1, 2, 3, 2 as item_id plus the histories' 1, 2, 3, 3, 2, 1, 5, 7, 9:
  # 1, 2, 3 are seen >= 2 times -> rows 1..3 and the OOV row 0.
  assert ds.spec.layout.tables[1].num_rows == 4
  batch = next(ds.eval_batches("eval", 4))
  assert batch.ids[3, 2] == 0  # 9: seen once, out of vocabulary
  assert len(set(batch.ids[:3, 1])) == 3 and 0 not in batch.ids[:3, 1]


def _criteo_as_parquet(tsv: str, out: str) -> None:
  """The rows of a Criteo TSV as Parquet: int dense columns, string categorical ones."""
  rows = [line.rstrip("\n").split("\t") for line in open(tsv)]
  cols = {"label": pa.array([int(r[0]) for r in rows])}
  for i in range(13):
    cols[f"I{i + 1}"] = pa.array([int(r[1 + i] or 0) for r in rows], pa.int64())
  for i in range(26):
    cols[f"C{i + 1}"] = pa.array([r[14 + i] for r in rows])
  pq.write_table(pa.table(cols), out, row_group_size=700)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_parquet_and_text_inputs_of_the_same_rows_give_identical_metrics(tmp_path):
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(tmp_path / "train.tsv"), "train", 3000)
  gen.write_criteo(str(tmp_path / "eval.tsv"), "eval", 1000)
  _criteo_as_parquet(str(tmp_path / "train.tsv"), str(tmp_path / "train.parquet"))
  _criteo_as_parquet(str(tmp_path / "eval.tsv"), str(tmp_path / "eval.parquet"))
  finals = {}
  for fmt, ext in (("criteo", "tsv"), ("parquet", "parquet")):
    c = ctr.get_config("smoke")
    c.data.format = fmt
    c.data.train_path, c.data.eval_path = f"{tmp_path}/train.{ext}", f"{tmp_path}/eval.{ext}"
    c.data.hash_rows = 500
    c.data.parquet.dense = ",".join(f"I{i}" for i in range(1, 14))
    c.data.parquet.dense_transform = "log1p"
    c.train.steps, c.train.eval_every, c.train.num_devices = 30, 30, 1
    data = dataset.make_dataset(c.data, c.seed)
    assert data.spec.layout is None and data.spec.num_fields == 26
    finals[fmt], _ = loop.train_and_evaluate(c, dataset=data)
  assert finals["parquet"]["auc"] == finals["criteo"]["auc"]
  assert finals["parquet"]["logloss"] == finals["criteo"]["logloss"]
  assert finals["parquet"]["step"] == 30


def test_preprocess_of_scalar_parquet_round_trips_and_lists_are_accepted(tmp_path):
  path = _write(tmp_path, _table(), row_group_size=3)
  c = _config(path, categorical="user,item_id")
  c.hash_rows, c.min_count, c.shuffle_buffer = 0, 1, 0
  meta = preprocessed.preprocess_files(c, str(tmp_path / "dir"), rows_per_shard=3)
  assert meta["source"]["format"] == "parquet" and meta["splits"]["train"]["num_examples"] == 4
  from_files = next(dataset.make_dataset(c, 0).eval_batches("eval", 4))
  c.format, c.train_path, c.eval_path = "preprocessed", str(tmp_path / "dir"), ""
  from_shards = next(dataset.make_dataset(c, 0).eval_batches("eval", 4))
  for a, b in zip(from_files, from_shards, strict=True):
    np.testing.assert_array_equal(a, b)
  # List columns are preprocessed too (values + offsets; tests/data/preprocessed_test.py).
  meta = preprocessed.preprocess_files(_config(path, **_BAGS), str(tmp_path / "lists"))
  assert meta["layout"]["features"][2]["kind"] == "sequence"

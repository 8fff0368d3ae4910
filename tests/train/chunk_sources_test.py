"""Tests for sfjax.train.chunk_sources and the chunked feed on Parquet files: chunk c of a
file is its c-th record batch, parsed alone as a pass parses it; the feed over Parquet
(bags with weights, sequences, bad rows skipped, several row groups and files) is the data
set's stream batch for batch, and its position (kind 'parquet') restarts it exactly,
parsing only the rows still waiting."""

import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments.configs import ctr
from sfjax.data import dataset as dataset_lib
from sfjax.data import index_stream
from sfjax.train import chunk_feed, chunk_sources, defaults
from tests.train.chunk_feed_test import assert_feed_is_stream, assert_same_batch

_CHUNK = 16  # rows per chunk: row groups of 50 make chunks of 16, 16, 16, 2


def _table(n, seed, bad=()):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, 6, n)
  label = pa.array([None if i in bad else int(v) for i, v in enumerate(rng.integers(0, 2, n))],
                   pa.int64())
  return pa.table({
      "label": label,
      "price": pa.array(rng.normal(size=n)),
      "user": pa.array([f"u{v}" for v in rng.integers(0, 40, n)]),
      "item_id": pa.array(rng.integers(0, 60, n), pa.int64()),
      "history": pa.array([list(rng.integers(0, 60, k)) for k in lengths], pa.list_(pa.int64())),
      "tags": pa.array([[f"t{v}" for v in rng.integers(0, 9, k)] for k in lengths[::-1]]),
      "tw": pa.array([list(rng.uniform(0.5, 2, k)) for k in lengths[::-1]]),
  })


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """a.parquet (230 rows, row groups of 50, rows 3 and 120 bad), b.parquet (170, one row
  group) and an eval file."""
  root = tmp_path_factory.mktemp("chunk_sources")
  pq.write_table(_table(230, 0, bad=(3, 120)), root / "a.parquet", row_group_size=50)
  pq.write_table(_table(170, 1), root / "b.parquet")
  pq.write_table(_table(40, 2), root / "eval.parquet")
  return root


def _data(root, train="a.parquet,b.parquet", shuffle_buffer=60, hash_rows=500):
  c = defaults.ctr_defaults().data
  c.format, c.hash_rows, c.skip_bad_lines, c.shuffle_buffer = "parquet", hash_rows, True, shuffle_buffer
  c.train_path = ",".join(str(root / name) for name in train.split(","))
  c.eval_path = str(root / "eval.parquet")
  c.parquet.dense = "price"
  c.parquet.bags = "history:sequence:3,tags:multi_hot:4:sqrtn:tw"
  c.parquet.shared_tables = "history=item_id"
  data = dataset_lib.make_dataset(c, 0)
  data.train_reader.chunk_rows = _CHUNK
  return data


def test_chunks_are_the_record_batches_of_a_pass(files):
  data = _data(files)
  source = chunk_sources.source_of(data)
  assert isinstance(source, chunk_sources.ParquetChunks) and source.kind == "parquet"
  # a: 4 x (16, 16, 16, 2) + (16, 14); b: 10 x 16 + 10
  assert [source.num_chunks(f) for f in range(2)] == [4 * 4 + 2, 11]
  parsed = []
  for f in range(2):
    for c in reversed(range(source.num_chunks(f))):  # any order: each chunk read alone
      rows, counts = source.parse(f, c)
      parsed.append(((f, c), rows, counts))
    assert source.parse(f, source.num_chunks(f))[0] is None
  parsed.sort(key=lambda p: p[0])
  ref = _data(files)
  stream = list(ref.chunks("train"))
  kept = [rows for _, rows, _ in parsed if rows.size]
  assert len(kept) == len(stream)
  for got, want in zip(kept, stream, strict=True):
    assert_same_batch(got, want)
  assert got.weights is not None and got.ids.shape[1] == 1 + 1 + 3 + 4
  by_chunk = {key: counts.tolist() for key, _, counts in parsed}
  assert by_chunk[(0, 0)][0] == 1 and by_chunk[(0, 9)][0] == 1  # rows 3 and 120 (group 2)
  assert sum(c[0] for c in by_chunk.values()) == 2
  assert sum(c[1] for c in by_chunk.values()) == ref.stats["truncated_ids"] > 0


@pytest.mark.parametrize("shuffle_buffer, batch_size", [(60, 24), (0, 32), (1000, 40)])
def test_the_feed_is_the_train_stream(files, shuffle_buffer, batch_size):
  data, ref = _data(files, shuffle_buffer=shuffle_buffer), _data(files, shuffle_buffer=shuffle_buffer)
  assert_feed_is_stream(data, ref, batch_size, 1000)  # 2.5 epochs


def test_with_a_vocabulary_the_feed_is_the_train_stream(files):
  data = _data(files)
  vocab = [_data(files, hash_rows=0) for _ in range(2)]
  assert vocab[0].spec.field_rows != data.spec.field_rows
  feed = chunk_feed.ChunkFeed(vocab[0], 32, seed=2)
  for batch in itertools.islice(vocab[1].train_batches(32, 2), 20):
    assert_same_batch(feed.next_batch(), batch)


def test_a_position_restarts_the_stream_exactly(files):
  feed = chunk_feed.ChunkFeed(_data(files), 24, seed=4)
  positions = {}
  for step in range(1, 31):  # past the first epoch (398 examples)
    feed.next_batch()
    positions[step] = json.loads(json.dumps(feed.position()))
  assert positions[5]["kind"] == "parquet"
  for step in (1, 9, 17, 25):
    resumed = chunk_feed.ChunkFeed(_data(files), 24, seed=4, position=positions[step])
    for batch in itertools.islice(_data(files).train_batches(24, 4), step, step + 10):
      assert_same_batch(resumed.next_batch(), batch)


def test_a_restart_parses_only_the_waiting_rows_whatever_the_step(files):
  feed = chunk_feed.ChunkFeed(_data(files), 8, seed=1)
  parsed, waiting = {}, {}
  for step in range(1, 401):  # 8 epochs of 398 examples
    feed.next_batch()
    if step in (5, 200, 400):
      again = _data(files)
      position = json.loads(json.dumps(feed.position()))
      chunk_feed.ChunkFeed(again, 8, seed=1, position=position)
      parsed[step] = again.train_reader.rows_parsed
      waiting[step] = sum(index_stream.decode_indices(position[k]).size
                          for k in ("buffer", "shuffle_pending", "pending"))
  # The 60 buffered rows and the rest of the last chunk; a chunk that lost a bad row is
  # checked whole (a.parquet's chunks 0 and 9), nothing of the epochs before.
  for step in (5, 200, 400):
    assert 60 <= waiting[step] < 60 + _CHUNK + 8, (parsed, waiting)
    assert waiting[step] <= parsed[step] <= waiting[step] + 2 * _CHUNK, (parsed, waiting)


def test_a_position_of_changed_files_or_another_kind_is_refused(files, tmp_path):
  feed = chunk_feed.ChunkFeed(_data(files, train="b.parquet"), 16, seed=0)
  for _ in range(3):
    feed.next_batch()
  position = feed.position()
  pq.write_table(_table(170, 1).slice(0, 40), tmp_path / "b.parquet")  # chunk 2 is 8 rows
  pq.write_table(_table(40, 2), tmp_path / "eval.parquet")
  with pytest.raises(ValueError, match=r"chunk \d+ of .*b\.parquet held 16 examples when saved, "
                     r"now \d+: the training files changed"):
    chunk_feed.ChunkFeed(_data(tmp_path, train="b.parquet"), 16, seed=0, position=position)
  with pytest.raises(ValueError, match="expected kind 'parquet', got 'text'"):
    chunk_feed.ChunkFeed(_data(files), 16, seed=0, position={"kind": "text"})


def test_every_row_bad_is_an_error_naming_the_key(files, tmp_path):
  pq.write_table(_table(10, 3, bad=range(10)), tmp_path / "bad.parquet")
  pq.write_table(_table(40, 2), tmp_path / "eval.parquet")
  feed = chunk_feed.ChunkFeed(_data(tmp_path, train="bad.parquet"), 8, seed=0)
  with pytest.raises(ValueError, match="data.train_path: split 'train' has no examples: all 10 "
                     "rows of .*bad.parquet were bad and skipped"):
    feed.next_batch()


def test_other_data_sets_have_no_chunk_source(files):
  c = ctr.get_config("smoke")
  assert chunk_sources.source_of(dataset_lib.make_dataset(c.data, 0)) is None  # synthetic
  data = _data(files)
  view = dataset_lib.feature_select.with_features(data, "user,tags")  # a view: a stream
  assert view is not data and chunk_sources.source_of(view) is None
  with pytest.raises(ValueError, match="is not read chunk by chunk"):
    chunk_feed.ChunkFeed(view, 8, seed=0)

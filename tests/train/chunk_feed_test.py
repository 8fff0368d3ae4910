"""Tests for sfjax.train.chunk_feed on text files: one process's feed is the data set's
stream, batch for batch (shuffled or not, plain and gzipped files, bad lines skipped), and
its position restarts it exactly, re-parsing only the chunks of the rows still waiting.
(Parquet: tests/train/chunk_sources_test.py.)"""

import gzip
import itertools
import json

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import avazu, index_stream
from sfjax.data import dataset as dataset_lib
from sfjax.data.generated import synthetic
from sfjax.train import chunk_feed

_CHUNK = 40  # lines per chunk: many chunks in small files


def write_criteo_files(root, plain, gzipped, eval_rows):
  """Criteo TSV files of the smoke generator (seed 0) under `root`, in this order: `plain`
  = (name, lines) as is, `gzipped` = (name, lines) as `name.gz`, and eval.tsv."""
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(root / plain[0]), "train", plain[1])
  gen.write_criteo(str(root / gzipped[0]), "train", gzipped[1])
  with open(root / gzipped[0], "rb") as f, gzip.open(root / f"{gzipped[0]}.gz", "wb") as g:
    g.write(f.read())
  (root / gzipped[0]).unlink()
  gen.write_criteo(str(root / "eval.tsv"), "eval", eval_rows)
  return root


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """Criteo TSV: a.tsv (500 lines), b.tsv.gz (300), c.tsv (200, two bad lines, no final
  line break) and an eval file."""
  root = tmp_path_factory.mktemp("chunk_feed")
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(root / "all.tsv"), "train", 1000)
  gen.write_criteo(str(root / "eval.tsv"), "eval", 50)
  lines = (root / "all.tsv").read_bytes().split(b"\n")
  (root / "a.tsv").write_bytes(b"\n".join(lines[:500]) + b"\n")
  with gzip.open(root / "b.tsv.gz", "wb") as f:
    f.write(b"\n".join(lines[500:800]) + b"\n")
  bad = lines[800:1000]
  bad[3], bad[150] = b"not a criteo line", b"2" + bad[150][1:]
  (root / "c.tsv").write_bytes(b"\n".join(bad))
  return root


def _data(root, train="a.tsv,b.tsv.gz,c.tsv", shuffle_buffer=150):
  c = ctr.get_config("smoke")
  c.data.format, c.data.hash_rows, c.data.skip_bad_lines = "criteo", 500, True
  c.data.train_path = ",".join(str(root / name) for name in train.split(","))
  c.data.eval_path, c.data.shuffle_buffer = str(root / "eval.tsv"), shuffle_buffer
  data = dataset_lib.make_dataset(c.data, 0)
  data.train_reader.chunk_lines = _CHUNK
  return data


def assert_same_batch(a, b):
  """Two batches (or tuples of arrays) equal field by field, None where the other is None."""
  for x, y in zip(a, b, strict=True):
    assert (x is None) == (y is None)
    if x is not None:
      np.testing.assert_array_equal(x, y)


def assert_feed_is_stream(data, ref, batch_size, examples):
  """A `ChunkFeed` over `data` yields `ref`'s train batches (seed 4) for `examples` examples,
  and leaves the same stats, two bad rows dropped."""
  assert chunk_feed.reads_chunks(data)
  feed = chunk_feed.ChunkFeed(data, batch_size, seed=4)
  for batch in itertools.islice(ref.train_batches(batch_size, 4), examples // batch_size):
    assert_same_batch(feed.next_batch(), batch)
  assert data.stats == ref.stats and data.stats["bad_lines"] == 2


@pytest.mark.parametrize("shuffle_buffer, batch_size", [(150, 32), (0, 32), (2000, 96)])
def test_the_feed_is_the_train_stream(files, shuffle_buffer, batch_size):
  data, ref = _data(files, shuffle_buffer=shuffle_buffer), _data(files, shuffle_buffer=shuffle_buffer)
  assert_feed_is_stream(data, ref, batch_size, 2500)  # 2.5 epochs


def test_a_position_restarts_the_stream_exactly(files):
  data = _data(files)
  feed = chunk_feed.ChunkFeed(data, 32, seed=4)
  positions = {}
  for step in range(1, 61):  # past the first epoch (998 examples)
    feed.next_batch()
    positions[step] = json.loads(json.dumps(feed.position()))
  for step in (1, 17, 31, 45):
    resumed = chunk_feed.ChunkFeed(_data(files), 32, seed=4, position=positions[step])
    for batch in itertools.islice(_data(files).train_batches(32, 4), step, step + 15):
      assert_same_batch(resumed.next_batch(), batch)


def test_a_restart_parses_only_the_waiting_rows_whatever_the_step(files):
  data = _data(files, train="a.tsv,c.tsv", shuffle_buffer=60)  # c.tsv: two lines dropped
  feed = chunk_feed.ChunkFeed(data, 16, seed=1)
  parsed, waiting = {}, {}
  for step in range(1, 401):  # ~9 epochs of 698 examples
    feed.next_batch()
    if step in (10, 200, 400):
      again = _data(files, train="a.tsv,c.tsv", shuffle_buffer=60)
      position = json.loads(json.dumps(feed.position()))
      chunk_feed.ChunkFeed(again, 16, seed=1, position=position)
      parsed[step] = again.train_reader.lines_parsed
      waiting[step] = sum(index_stream.decode_indices(position[k]).size
                          for k in ("buffer", "shuffle_pending", "pending"))
  # The lines of the 60 buffered rows and of the rest of the last chunk (< 40 + 16), not
  # the epochs before; a chunk that lost bad lines is parsed whole (c.tsv's 1st and 4th).
  for step in (10, 200, 400):
    assert 60 <= waiting[step] < 60 + _CHUNK + 16, (parsed, waiting)
    assert waiting[step] <= parsed[step] <= waiting[step] + 2 * _CHUNK, (parsed, waiting)
  assert parsed[10] == waiting[10]


def test_a_position_of_other_files_or_another_kind_is_refused(files, tmp_path):
  data = _data(files, train="a.tsv")
  feed = chunk_feed.ChunkFeed(data, 32, seed=0)
  for _ in range(3):
    feed.next_batch()
  position = feed.position()
  shorter = tmp_path / "a.tsv"  # the same name, its first 100 lines: chunk 2 is half
  shorter.write_bytes(b"".join((files / "a.tsv").read_bytes().splitlines(True)[:100]))
  eval_file = files / "eval.tsv"
  (tmp_path / "eval.tsv").write_bytes(eval_file.read_bytes())
  with pytest.raises(ValueError, match=r"chunk \d+ of .*a\.tsv held 40 examples when saved, now 20: the training files changed"):
    chunk_feed.ChunkFeed(_data(tmp_path, train="a.tsv"), 32, seed=0, position=position)
  with pytest.raises(ValueError, match="expected kind 'text', got 'shards'"):
    chunk_feed.ChunkFeed(data, 32, seed=0, position={"kind": "shards"})


def test_every_line_bad_is_an_error_naming_the_key(tmp_path, files):
  (tmp_path / "bad.tsv").write_bytes(b"x\ny\n")
  (tmp_path / "eval.tsv").write_bytes((files / "eval.tsv").read_bytes())
  feed = chunk_feed.ChunkFeed(_data(tmp_path, train="bad.tsv"), 8, seed=0)
  with pytest.raises(ValueError, match="data.train_path: split 'train' has no examples"):
    feed.next_batch()


def test_avazu_files_with_a_header_are_fed_as_their_stream(tmp_path):
  header = ["id", "click", "hour"] + list(avazu.CATEGORICAL_COLUMNS)
  rng = np.random.default_rng(0)
  for name, n in (("a.csv", 230), ("b.csv", 170)):
    rows = [",".join([str(i), str(i % 2), f"141021{i % 24:02d}"] +
                     [f"v{k}" for k in rng.integers(0, 30, len(avazu.CATEGORICAL_COLUMNS))])
            for i in range(n)]
    (tmp_path / name).write_text("\n".join([",".join(header)] + rows) + "\n")
  c = ctr.get_config("smoke")
  c.data.format, c.data.hash_rows, c.data.shuffle_buffer = "avazu", 100, 90
  c.data.train_path, c.data.eval_path = f"{tmp_path}/*.csv", str(tmp_path / "a.csv")
  data, ref = dataset_lib.make_dataset(c.data, 0), dataset_lib.make_dataset(c.data, 0)
  data.train_reader.chunk_lines = ref.train_reader.chunk_lines = 32
  feed = chunk_feed.ChunkFeed(data, 24, seed=3)
  batches = list(itertools.islice(ref.train_batches(24, 3), 25))  # 1.5 epochs
  for batch in batches:
    assert_same_batch(feed.next_batch(), batch)
  resumed = chunk_feed.ChunkFeed(data, 24, seed=3, position=json.loads(json.dumps(feed.position())))
  for batch in itertools.islice(ref.train_batches(24, 3), 25, 35):
    assert_same_batch(resumed.next_batch(), batch)

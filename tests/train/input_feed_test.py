"""Tests for sfjax.train.input_feed: the feed gives the data set's stream, positions that
restart it exactly, and replays what cannot be read by index."""

import itertools
import json

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import dataset as dataset_lib
from sfjax.data import feature_select
from sfjax.data.generated import synthetic
from sfjax.train import input_feed


def _data():
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 3000, 64
  return dataset_lib.make_dataset(c.data, 0)


def _equal(a, b):
  for x, y in zip(a, b, strict=True):
    assert (x is None) == (y is None)
    if x is not None:
      np.testing.assert_array_equal(x, y)


def _multihot():
  c = ctr.get_config("smoke")
  c.data.format = "multihot"
  c.data.multihot.num_train, c.data.multihot.num_eval = 3000, 64
  return dataset_lib.make_dataset(c.data, 0)


@pytest.mark.parametrize("make", [_data, pytest.param(_multihot, marks=pytest.mark.slow)],
                         ids=["synthetic", "multihot"])
def test_the_feed_is_the_train_stream_and_counts_rows(make):
  data = make()
  feed = input_feed.InputFeed(data, 64, seed=2)
  assert feed.by_index
  for batch in itertools.islice(data.train_batches(64, 2), 60):  # past an epoch
    _equal(next(feed), batch)
  assert input_feed.rows_read(data) == {"rows_read": 60 * 64}


def test_a_saved_position_restarts_the_stream():
  data = _data()
  feed = input_feed.InputFeed(data, 64, seed=2)
  for _ in range(10):
    next(feed)
  position = json.loads(json.dumps(feed.position_at(7)))
  resumed = input_feed.InputFeed(data, 64, seed=2, start=7, position=position)
  replayed = input_feed.InputFeed(data, 64, seed=2, start=7)  # an old checkpoint: no position
  for batch in itertools.islice(data.train_batches(64, 2), 7, 12):
    _equal(next(resumed), batch)
    _equal(next(replayed), batch)
  with pytest.raises(KeyError, match="no input position after 99 batches"):
    feed.position_at(99)


def test_a_position_of_another_step_is_refused():
  data = _data()
  feed = input_feed.InputFeed(data, 64, seed=2)
  next(feed)
  with pytest.raises(ValueError, match="input_position: a position after 1 batches, the "
                                       "checkpoint is at step 5"):
    input_feed.InputFeed(data, 64, seed=2, start=5, position=feed.position_at(1))


def test_a_view_is_read_as_a_stream_and_replayed():
  data = feature_select.with_features(_data(), "C1,C2")
  assert not input_feed.reads_by_index(data)
  feed = input_feed.InputFeed(data, 32, seed=1)
  batches = [next(feed) for _ in range(5)]
  assert feed.position_at(5) == {"kind": "replay", "batches": 5}
  resumed = input_feed.InputFeed(data, 32, seed=1, start=3, position=feed.position_at(3))
  _equal(next(resumed), batches[3])
  with pytest.raises(ValueError, match="read as a stream"):
    input_feed.InputFeed(data, 32, seed=1, start=0,
                         position={"kind": "chunked", "batches": 0})


def test_text_files_are_fed_chunk_by_chunk_and_resumed_by_position_or_replay(tmp_path):
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(tmp_path / "train.tsv"), "train", 700)
  gen.write_criteo(str(tmp_path / "eval.tsv"), "eval", 20)
  c = ctr.get_config("smoke")
  c.data.format, c.data.hash_rows, c.data.shuffle_buffer = "criteo", 100, 200
  c.data.train_path, c.data.eval_path = str(tmp_path / "train.tsv"), str(tmp_path / "eval.tsv")
  data = dataset_lib.make_dataset(c.data, 0)
  data.train_reader.chunk_lines = 64
  feed = input_feed.InputFeed(data, 32, seed=1)
  assert feed.by_chunks and not feed.by_index
  ref = list(itertools.islice(data.train_batches(32, 1), 30))  # past an epoch
  for batch in ref:
    _equal(next(feed), batch)
  position = json.loads(json.dumps(feed.position_at(20)))
  assert position["kind"] == "text"
  resumed = input_feed.InputFeed(data, 32, seed=1, start=20, position=position)
  replayed = input_feed.InputFeed(data, 32, seed=1, start=20,  # a checkpoint before text positions
                                  position={"kind": "replay", "batches": 20})
  for batch in ref[20:]:
    _equal(next(resumed), batch)
    _equal(next(replayed), batch)

"""Resume by seeking on chunked files (issue #24): a Criteo run, and a Parquet run with bags,
that crashed after the step-10 checkpoint resume at the saved input position (kind 'text' or
'parquet': the next chunk, the shuffle's rng and waiting ids), parse only the waiting rows,
not the 10 steps before, and end bit-identical to the uninterrupted run."""


import chex
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.data import dataset as dataset_lib
from sfjax.train import input_feed, loop
from tests.train.chunk_feed_test import write_criteo_files
from tests.train.resume_test import _crashing, assert_resumed_at


@pytest.fixture(scope="module")
def text_root(tmp_path_factory):
  """Criteo TSV: train_0.tsv (3,000 lines), train_1.tsv.gz (2,000), eval.tsv (500)."""
  return write_criteo_files(tmp_path_factory.mktemp("text_resume"), ("train_0.tsv", 3000),
                            ("train_1.tsv", 2000), 500)


def _text_config(root):
  c = ctr.get_config("smoke")
  c.data.format, c.data.hash_rows, c.data.shuffle_buffer = "criteo", 3000, 700
  c.data.train_path, c.data.eval_path = f"{root}/train_*", str(root / "eval.tsv")
  return c


def _run(c, workdir, crash_at=None):
  """Trains `c` 40 steps of 128, checkpoints every 10, in chunks of 256 lines / rows (many:
  the position falls inside a file or row group); `crash_at`: the step call that raises."""
  c.train.num_devices, c.train.steps, c.train.eval_every, c.train.batch_size = 1, 40, 20, 128
  c.checkpoint.every_steps, c.checkpoint.keep = 10, 2
  data = dataset_lib.make_dataset(c.data, c.seed)
  if c.data.format == "parquet":
    data.train_reader.chunk_rows = 256
  else:
    data.train_reader.chunk_lines = 256
  trainer = loop.build_trainer(c, data.spec)
  if crash_at is not None:
    trainer = _crashing(trainer, crash_at, RuntimeError("node lost"))
  losses = []
  final, state = loop.train_and_evaluate(c, str(workdir), dataset=data, trainer=trainer,
                                         loss_log=losses)
  return final, state, losses, data


def _crash_and_resume(make_config, tmp_path, kind):
  """The uninterrupted run, a run crashed at step 15 and its resume; asserts the resume
  trained steps 11..40 only, each bit-identical, and ended equal. Returns (the step-10
  position, the resumed run's data set, the uninterrupted run's)."""
  ref, ref_state, ref_losses, ref_data = _run(make_config(), tmp_path / "ref")  # past an epoch
  with pytest.raises(RuntimeError, match="node lost"):
    _run(make_config(), tmp_path / "run", crash_at=15)
  meta = checkpoint.read_meta(str(tmp_path / "run" / checkpoint.CHECKPOINT_DIR /
                                  checkpoint.step_dir_name(10)))
  position = meta[input_feed.POSITION_KEY]
  assert position["kind"] == kind and position["batches"] == 10 and position["pieces"]
  resumed, state, losses, data = _run(make_config(), tmp_path / "run")
  assert_resumed_at(losses, ref_losses, 10)  # steps 11..40 only, each bit-identical
  assert loop.training_result(resumed) == loop.training_result(ref)
  chex.assert_trees_all_equal(jax.device_get((state.params, state.table)),
                              jax.device_get((ref_state.params, ref_state.table)))
  return position, data, ref_data


@pytest.mark.slow  # three training runs (~15 s on a quiet machine)
def test_a_text_run_resumes_at_its_input_position_bit_identical(text_root, tmp_path):
  position, data, ref_data = _crash_and_resume(lambda: _text_config(text_root), tmp_path, "text")
  # No replay: the restart parsed the waiting rows' lines (the 700 buffered, the rest of
  # the last chunk), then what the uninterrupted run parsed after the saved cursor.
  before = (3000 if position["file"] == 1 else 0) + position["chunk"] * 256
  assert before > 1000
  assert data.train_reader.lines_parsed <= ref_data.train_reader.lines_parsed - before + 700 + 2 * 256


@pytest.fixture(scope="module")
def parquet_root(tmp_path_factory):
  """Parquet: train_0 (3,000 rows, row groups of 1,000), train_1 (2,000), eval (500);
  scalar columns, a dense one, a weighted bag and a sequence."""
  root = tmp_path_factory.mktemp("parquet_resume")
  for name, n, seed in (("train_0", 3000, 0), ("train_1", 2000, 1), ("eval", 500, 2)):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5, n)
    table = pa.table({
        "label": pa.array(rng.integers(0, 2, n), pa.int64()),
        "price": pa.array(rng.normal(size=n)),
        "user": pa.array(rng.integers(0, 300, n), pa.int64()),
        "item_id": pa.array(rng.integers(0, 500, n), pa.int64()),
        "history": pa.array([list(rng.integers(0, 500, k)) for k in lengths], pa.list_(pa.int64())),
        "tags": pa.array([[f"t{v}" for v in rng.integers(0, 30, k)] for k in lengths]),
        "tw": pa.array([list(rng.uniform(0.5, 2, k)) for k in lengths]),
    })
    pq.write_table(table, root / f"{name}.parquet", row_group_size=1000)
  return root


def _parquet_config(root):
  c = ctr.get_config("smoke")
  c.data.format, c.data.hash_rows, c.data.shuffle_buffer = "parquet", 3000, 700
  c.data.train_path, c.data.eval_path = f"{root}/train_*", str(root / "eval.parquet")
  c.data.parquet.dense = "price"
  c.data.parquet.bags = "history:sequence:4,tags:multi_hot:4:mean:tw"
  c.data.parquet.shared_tables = "history=item_id"
  return c


@pytest.mark.slow  # three training runs
def test_a_parquet_run_resumes_at_its_input_position_bit_identical(parquet_root, tmp_path):
  position, data, ref_data = _crash_and_resume(lambda: _parquet_config(parquet_root), tmp_path,
                                               "parquet")
  # No replay: the restart parsed the waiting rows (the 700 buffered, the rest of the last
  # chunk), then what the uninterrupted run parsed after the saved cursor. (Chunks of a
  # row group of 1,000 rows: 256, 256, 256, 232.)
  before = (3000 if position["file"] == 1 else 0) + position["chunk"] // 4 * 1000 + min(
      position["chunk"] % 4 * 256, 1000)
  assert before > 1000
  assert data.train_reader.rows_parsed <= ref_data.train_reader.rows_parsed - before + 700 + 256

"""Per-process input (issue #24): 2 (and, slow, 4) local `jax.distributed` processes train
on preprocessed shards exactly as one process does, while each reads only its own rows of
every global batch: the reader's instrumented counter (`rows_read`) and the indices each
process read show the reads disjoint and complete. The run checkpoints and a second
launch resumes it by seeking (the saved input position) to the same end.

Text (Criteo TSV, a plain and a gzipped file): each process parses only its chunks (chunk
k of the f-th file is process (f + k) % P's, a .gz file process f % P's), the global
batches, the losses and the table equal one process's, the lines parsed add up to the
lines consumed, and a run resumes from its text position by seeking (`train/chunk_feed`).

Parquet (a weighted bag, a sequence, bad rows skipped; chunk c of a file is its c-th record
batch): each process parses only chunks (f + c) % P == p, the global batches (ids, weights,
labels), the losses and the table equal one process's, the rows parsed add up to the rows
consumed, and a run resumes from its position (kind 'parquet') parsing no replayed rows.

(The fast tier's 2-process runs, tests/parallel/distributed_test.py and
multiprocess_checkpoint_test.py, train on synthetic data, which is read per process too.)
"""

import itertools
import json
import textwrap

import chex
import numpy as np
import pyarrow.parquet as pq
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.data import dataset as dataset_lib
from sfjax.data import preprocessed
from sfjax.data.generated import synthetic
from sfjax.train import loop
from tests.parallel import two_processes
from tests.train.chunk_feed_test import write_criteo_files
from tests.train.chunk_sources_test import _table

_STEPS, _BATCH = 12, 32

# One process: trains (recording the indices its reader was asked for), saves its losses,
# metrics, the replicated table and what it read.
_WORKER = textwrap.dedent("""
    import json, os
    import numpy as np
    from tests.parallel import two_processes
    c, _, pid, out, count = two_processes.join_run()
    from sfjax.parallel import distributed
    from sfjax.data import dataset as dataset_lib
    from sfjax.train import loop
    for name in ("first", "resumed"):  # the second run resumes step 6's checkpoint by seeking
      if name == "resumed":
        if pid == 0:  # the run as if killed after step 6: its last checkpoint goes
          from sfjax.checkpoint import checkpointer as checkpoint
          import shutil
          shutil.rmtree(os.path.join(out, "work", checkpoint.CHECKPOINT_DIR,
                                     checkpoint.step_dir_name(12)))
        assert not distributed.failed_processes(True)  # a barrier
      data = dataset_lib.make_dataset(c.data, c.seed)
      seen, real = [], data.read_train
      def read(indices, real=real, seen=seen):  # instrumentation around the real reader
        seen.append(np.asarray(indices).copy())
        return real(indices)
      data.read_train = read
      losses = []
      final, state = loop.train_and_evaluate(c, os.path.join(out, "work"), dataset=data,
                                             loss_log=losses)
      np.savez(os.path.join(out, f"{name}_p{pid}.npz"), losses=np.asarray(losses),
               values=np.asarray(state.table.values), seen=np.stack(seen),
               rows_read=data.stats["rows_read"])
      with open(os.path.join(out, f"{name}_p{pid}.json"), "w") as f:
        json.dump(final, f)
""")


def _run(count: int, payload: str, out_dir, timeout: int) -> None:
  """`count` worker processes of one jax.distributed job on loopback, 8/count CPU devices
  each; every one must exit 0 within `timeout` s (else all are killed and the test fails)."""
  two_processes.launch(_WORKER, payload, out_dir, timeout, devices=8 // count, count=count)


@pytest.fixture(scope="module")
def shards_dir(tmp_path_factory):
  """A preprocessed data set: 1,500 Criteo-like rows in 4 shards, 300 eval rows."""
  root = tmp_path_factory.mktemp("per_process_input")
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(root / "train.tsv"), "train", 1500)
  gen.write_criteo(str(root / "eval.tsv"), "eval", 300)
  d = ctr.get_config().data
  d.format, d.train_path, d.eval_path = "criteo", str(root / "train.tsv"), str(root / "eval.tsv")
  d.hash_rows, d.shuffle_buffer = 2000, 0
  preprocessed.preprocess_files(d, str(root / "pre"), rows_per_shard=400)
  return root / "pre"


def _config(shards_dir):
  c = ctr.get_config("smoke")
  c.data.format, c.data.train_path, c.data.shuffle_buffer = "preprocessed", str(shards_dir), 300
  c.model.mlp_dims, c.model.embed_dim = (16,), 4
  c.embedding.learning_rate = 0.1
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = _STEPS, _BATCH, 6, 100
  c.train.eval_batch_size, c.train.num_devices, c.train.prefetch = 64, 1, 2
  c.checkpoint.every_steps = 6
  return c


def _check(count, shards_dir, out):
  c = _config(shards_dir)
  data = dataset_lib.make_dataset(c.data, c.seed)
  ref_losses = []
  ref_final, ref_state = loop.train_and_evaluate(c, dataset=data, loss_log=ref_losses)
  order = data.train_order(_BATCH, c.seed)
  ref_batches = np.stack([order.next_batch() for _ in range(_STEPS)])  # [steps, B]
  _run(count, json.dumps(two_processes.flat_config(c)), out, timeout=150 + 60 * count)
  share = _BATCH // count
  for name, first in (("first", 0), ("resumed", 6)):
    last = _STEPS
    runs = [np.load(out / f"{name}_p{p}.npz") for p in range(count)]
    finals = [json.loads((out / f"{name}_p{p}.json").read_text()) for p in range(count)]
    for p, run in enumerate(runs):
      chex.assert_trees_all_close(run["losses"], np.asarray(ref_losses[first:last]),
                                  rtol=1e-4, atol=1e-5)
      seen = run["seen"]  # [batches read (the feed may run ahead), B/P]
      assert seen.shape[1] == share and int(run["rows_read"]) == seen.size
      # Process p read exactly its rows of each global batch: disjoint, and together complete.
      np.testing.assert_array_equal(seen[:last - first],
                                    ref_batches[first:last, p * share:(p + 1) * share])
      # (resumed: its first read is batch 6's rows: the run started at the saved position)
      chex.assert_trees_all_close(run["values"], np.asarray(ref_state.table.values),
                                  rtol=1e-3, atol=1e-4)
      for key in ("auc", "logloss"):
        np.testing.assert_allclose(finals[p][key], ref_final[key], rtol=1e-4, err_msg=key)


@pytest.mark.slow  # ~17 s on a quiet machine (two process start-ups + a 1-process reference)
@pytest.mark.timeout(400)
def test_two_processes_read_disjoint_halves_and_train_as_one(shards_dir, tmp_path):
  _check(2, shards_dir, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_processes_read_disjoint_quarters_and_train_as_one(shards_dir, tmp_path):
  _check(4, shards_dir, tmp_path)


# --- text files (Criteo TSV): each chunk parsed by one process, resume by seeking --------

_TEXT_CHUNK_LINES = 50  # small chunks: the 600 + 400 lines split over both processes

# One process of a text run: the worker above with what the reader parsed recorded
# (path, chunk, lines) instead of the index reads.
_TEXT_WORKER = _WORKER.replace("""  seen, real = [], data.read_train
  def read(indices, real=real, seen=seen):  # instrumentation around the real reader
    seen.append(np.asarray(indices).copy())
    return real(indices)
  data.read_train = read
""", """  reader = data.train_reader
  reader.chunk_lines = CHUNK_LINES
  seen, real = [], reader.parse_lines
  def parse(lines, *args, real=real, seen=seen, **kwargs):  # instrumentation around the real parser
    seen.append((lines.path, (lines.first_line - 1) // CHUNK_LINES, len(lines.lines)))
    return real(lines, *args, **kwargs)
  reader.parse_lines = parse
""".replace("CHUNK_LINES", str(_TEXT_CHUNK_LINES))).replace(
    'seen=np.stack(seen),\n           rows_read=data.stats["rows_read"]',
    'seen=np.asarray(seen, dtype=object), lines_parsed=reader.lines_parsed')
assert "data.read_train" not in _TEXT_WORKER and "rows_read" not in _TEXT_WORKER


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
  """Criteo TSV: a plain train file of 600 lines, a gzipped one of 400, 300 eval lines."""
  return write_criteo_files(tmp_path_factory.mktemp("per_process_text"), ("a.tsv", 600),
                            ("b.tsv", 400), 300)


def _text_config(root):
  c = _config(root)
  c.data.format, c.data.hash_rows, c.data.shuffle_buffer = "criteo", 2000, 300
  c.data.train_path = f"{root}/a.tsv,{root}/b.tsv.gz"
  c.data.eval_path = str(root / "eval.tsv")
  return c


@pytest.mark.slow  # two process start-ups + a 1-process reference
@pytest.mark.timeout(400)
def test_two_processes_parse_disjoint_text_chunks_and_train_as_one(text_files, tmp_path):
  c = _text_config(text_files)
  data = dataset_lib.make_dataset(c.data, c.seed)
  reader = data.train_reader
  reader.chunk_lines = _TEXT_CHUNK_LINES
  ref_chunks, real = set(), reader.parse_lines
  reader.parse_lines = lambda lines, *args, **kwargs: ref_chunks.add(
      (lines.path, (lines.first_line - 1) // _TEXT_CHUNK_LINES)) or real(lines, *args, **kwargs)
  ref_losses = []
  ref_final, ref_state = loop.train_and_evaluate(c, dataset=data, loss_log=ref_losses)
  two_processes.launch(_TEXT_WORKER, json.dumps(two_processes.flat_config(c)), tmp_path, 300,
                       devices=4, count=2)
  a, b = str(text_files / "a.tsv"), str(text_files / "b.tsv.gz")
  for name, first in (("first", 0), ("resumed", 6)):
    runs = [np.load(tmp_path / f"{name}_p{p}.npz", allow_pickle=True) for p in range(2)]
    for p, run in enumerate(runs):
      final = json.loads((tmp_path / f"{name}_p{p}.json").read_text())
      chex.assert_trees_all_close(run["losses"], np.asarray(ref_losses[first:]),
                                  rtol=1e-4, atol=1e-5)
      chex.assert_trees_all_close(run["values"], np.asarray(ref_state.table.values),
                                  rtol=1e-3, atol=1e-4)
      for key in ("auc", "logloss"):
        np.testing.assert_allclose(final[key], ref_final[key], rtol=1e-4, err_msg=key)
      # Only its own chunks: chunk c of a.tsv is process c % 2's, b.tsv.gz process 1's.
      for path, chunk, _ in run["seen"]:
        assert (chunk % 2 if path == a else 1) == p, (name, p, path, chunk)
      assert int(run["lines_parsed"]) == sum(n for *_, n in run["seen"])
    parsed = [{(path, chunk) for path, chunk, _ in run["seen"]} for run in runs]
    assert parsed[0] and parsed[1] and not parsed[0] & parsed[1]  # disjoint parts
    if name == "first":  # together, every chunk one process parsed (and some read ahead)
      assert ref_chunks <= parsed[0] | parsed[1] and any(path == b for path, _ in ref_chunks)


# One process takes 20 global batches of a text feed (no training: nothing reads ahead but
# the feed's own look-ahead), then restarts from the position after batch 12.
_FEED_WORKER = textwrap.dedent("""
    import json, os
    import numpy as np
    from tests.parallel import two_processes
    c, _, pid, out, count = two_processes.join_run()
    from sfjax.parallel import distributed
    from sfjax.data import dataset as dataset_lib
    from sfjax.train import input_feed
    data = dataset_lib.make_dataset(c.data, c.seed)
    reader = data.train_reader
    reader.chunk_lines = CHUNK_LINES
    seen, real = [], reader.parse_lines
    def parse(lines, *args, **kwargs):  # instrumentation around the real parser: (file, chunk, lines)
      seen.append((reader.paths.index(lines.path), (lines.first_line - 1) // CHUNK_LINES,
                   len(lines.lines)))
      return real(lines, *args, **kwargs)
    reader.parse_lines = parse
    feed = input_feed.InputFeed(data, c.train.batch_size, c.seed)
    labels = [next(feed).labels for _ in range(20)]
    position = feed.position_at(20)
    parsed = data.train_reader.lines_parsed
    assert not distributed.failed_processes(True)  # a barrier: all are done with the 1st feed
    again = dataset_lib.make_dataset(c.data, c.seed)
    again.train_reader.chunk_lines = CHUNK_LINES
    resumed = input_feed.InputFeed(again, c.train.batch_size, c.seed, 12,
                                   json.loads(json.dumps(feed.position_at(12))))
    relabels = [next(resumed).labels for _ in range(8)]
    np.savez(os.path.join(out, f"feed_p{pid}.npz"), labels=np.stack(labels),
             relabels=np.stack(relabels), parsed=parsed, seen=np.asarray(seen),
             cursor=[position["epoch"], position["file"], position["chunk"]])
""").replace("CHUNK_LINES", str(_TEXT_CHUNK_LINES))


def _launch_feed(worker, c, count, tmp_path):
  """Runs a feed worker over `count` processes; (their saved runs, the cursor's chunk), the
  cursor after 20 batches of 32 (+ the buffer) being inside the second file."""
  two_processes.launch(worker, json.dumps(two_processes.flat_config(c)), tmp_path,
                       120 + 60 * count, devices=8 // count, count=count)
  runs = [np.load(tmp_path / f"feed_p{p}.npz") for p in range(count)]
  epoch, file, chunk = runs[0]["cursor"].tolist()
  assert (epoch, file) == (0, 1) and chunk > 0
  return runs, chunk


def _assert_chunks_parsed_once(runs, seen, chunk, consumed):
  """Nothing parsed twice; each process parsed exactly its chunks' sizes; the chunks taken in
  before the cursor (file 1, chunk `chunk`) hold exactly the `consumed` examples."""
  keys = [(f, k) for s in seen for f, k, _ in s]
  assert len(keys) == len(set(keys))
  for run, s in zip(runs, seen, strict=True):
    assert int(run["parsed"]) == s[:, 2].sum()
  assert sum(n for s in seen for f, k, n in s if (f, k) < (1, chunk)) == consumed


def _check_text_feed(count, text_files, tmp_path):
  c = _text_config(text_files)
  data = dataset_lib.make_dataset(c.data, c.seed)
  data.train_reader.chunk_lines = _TEXT_CHUNK_LINES
  ref = np.stack([b.labels for b in itertools.islice(data.train_batches(_BATCH, c.seed), 20)])
  runs, chunk = _launch_feed(_FEED_WORKER, c, count, tmp_path)  # into b.tsv.gz
  consumed = 600 + chunk * _TEXT_CHUNK_LINES  # lines of the chunks taken in
  for run in runs:
    np.testing.assert_array_equal(run["labels"], ref)  # the same global batches as 1 process
    np.testing.assert_array_equal(run["relabels"], ref[12:])  # resumed at batch 12's position
  # Each chunk parsed by one process: chunk k of a.tsv by process k % P, b.tsv.gz by
  # process 1; the lines of the chunks taken in (before the cursor) add up to the lines
  # consumed, exactly; nothing is parsed twice.
  seen = [run["seen"] for run in runs]
  for p, s in enumerate(seen):
    assert {(f, k) for f, k, _ in s if f == 0} == {(0, k) for k in range(12) if k % count == p}
    assert p == 1 or not (s[:, 0] == 1).any()
  _assert_chunks_parsed_once(runs, seen, chunk, consumed)
  assert 0 <= (seen[1][:, 0] == 1).sum() - chunk <= 2 * count  # read ahead: the look-ahead


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_processes_text_feed_parses_each_line_once_and_resumes_by_seeking(text_files,
                                                                              tmp_path):
  _check_text_feed(2, text_files, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_four_processes_text_feed_parses_each_line_once(text_files, tmp_path):
  _check_text_feed(4, text_files, tmp_path)


# --- Parquet: each chunk (record batch) parsed by one process, resume by seeking ----------

_PARQUET_CHUNK_ROWS = 40  # row groups of 200 rows: 5 chunks each

# The training worker above, with the chunks its reader parsed recorded: (file, chunk, rows).
_PARQUET_WORKER = _WORKER.replace("""  seen, real = [], data.read_train
  def read(indices, real=real, seen=seen):  # instrumentation around the real reader
    seen.append(np.asarray(indices).copy())
    return real(indices)
  data.read_train = read
""", """  reader = data.train_reader
  reader.chunk_rows = CHUNK_ROWS
  seen, real = [], reader.read_chunk
  def read(path, chunk, real=real, seen=seen):  # instrumentation around the real reader
    got = real(path, chunk)
    if got is not None:
      seen.append((reader.paths.index(path), chunk, got[0].size + got[1]))
    return got
  reader.read_chunk = read
""".replace("CHUNK_ROWS", str(_PARQUET_CHUNK_ROWS))).replace(
    'seen=np.stack(seen),\n           rows_read=data.stats["rows_read"]',
    'seen=np.asarray(seen).reshape(-1, 3), rows_parsed=reader.rows_parsed')
assert "data.read_train" not in _PARQUET_WORKER and "rows_read" not in _PARQUET_WORKER


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory):
  """a.parquet: 600 rows in row groups of 200 (rows 7 and 333 bad); b.parquet: 400 rows in
  one row group; eval.parquet: 300 rows."""
  root = tmp_path_factory.mktemp("per_process_parquet")
  pq.write_table(_table(600, 0, bad=(7, 333)), root / "a.parquet", row_group_size=200)
  pq.write_table(_table(400, 1), root / "b.parquet")
  pq.write_table(_table(300, 2), root / "eval.parquet")
  return root


def _parquet_config(root):
  c = _config(root)
  c.data.format, c.data.hash_rows, c.data.shuffle_buffer = "parquet", 2000, 300
  c.data.skip_bad_lines = True
  c.data.train_path = f"{root}/a.parquet,{root}/b.parquet"
  c.data.eval_path = str(root / "eval.parquet")
  c.data.parquet.dense = "price"
  c.data.parquet.bags = "history:sequence:3,tags:multi_hot:4:sqrtn:tw"
  c.data.parquet.shared_tables = "history=item_id"
  return c


def _parquet_data(c):
  data = dataset_lib.make_dataset(c.data, c.seed)
  data.train_reader.chunk_rows = _PARQUET_CHUNK_ROWS
  return data


@pytest.mark.slow  # two process start-ups + a 1-process reference
@pytest.mark.timeout(400)
def test_two_processes_parse_disjoint_parquet_chunks_train_as_one_and_resume(parquet_files,
                                                                             tmp_path):
  c = _parquet_config(parquet_files)
  ref_losses = []
  ref_final, ref_state = loop.train_and_evaluate(c, dataset=_parquet_data(c), loss_log=ref_losses)
  two_processes.launch(_PARQUET_WORKER, json.dumps(two_processes.flat_config(c)), tmp_path, 300,
                       devices=4, count=2)
  saved = checkpoint.read_meta(str(tmp_path / "work" / checkpoint.CHECKPOINT_DIR /
                                   checkpoint.step_dir_name(6)))["input_position"]
  assert saved["kind"] == "parquet" and saved["batches"] == 6
  cursor = (saved["file"], saved["chunk"])
  assert cursor > (0, 6)  # 6 x 32 examples and the buffer of 300: into a.parquet's 3rd group
  for name, first in (("first", 0), ("resumed", 6)):
    runs = [np.load(tmp_path / f"{name}_p{p}.npz") for p in range(2)]
    for p, run in enumerate(runs):
      final = json.loads((tmp_path / f"{name}_p{p}.json").read_text())
      chex.assert_trees_all_close(run["losses"], np.asarray(ref_losses[first:]),
                                  rtol=1e-4, atol=1e-5)
      chex.assert_trees_all_close(run["values"], np.asarray(ref_state.table.values),
                                  rtol=1e-3, atol=1e-4)
      for key in ("auc", "logloss"):
        np.testing.assert_allclose(final[key], ref_final[key], rtol=1e-4, err_msg=key)
      assert all((f + k) % 2 == p for f, k, _ in run["seen"]), (name, p)  # its own only
    parsed = [{(f, k) for f, k, _ in run["seen"]} for run in runs]
    assert parsed[0] and parsed[1] and not parsed[0] & parsed[1]  # disjoint parts
    if name == "resumed":  # no replay: chunks from the saved cursor on, plus the waiting rows
      assert min(min(p) for p in parsed) >= cursor
      restore = sum(int(run["rows_parsed"]) - int(run["seen"][:, 2].sum()) for run in runs)
      assert 0 < restore <= 300 + 2 * _PARQUET_CHUNK_ROWS + 32


# One process takes 20 global batches of a Parquet feed (no training), then restarts from
# the position after batch 12.
_PARQUET_FEED_WORKER = textwrap.dedent("""
    import json, os
    import numpy as np
    from tests.parallel import two_processes
    c, _, pid, out, _ = two_processes.join_run()
    from sfjax.data import dataset as dataset_lib
    from sfjax.train import input_feed
    def make():
      data = dataset_lib.make_dataset(c.data, c.seed)
      data.train_reader.chunk_rows = CHUNK_ROWS
      return data
    data = make()
    reader = data.train_reader
    seen, real = [], reader.read_chunk
    def read(path, chunk):  # instrumentation around the real reader: (file, chunk, rows)
      got = real(path, chunk)
      if got is not None:
        seen.append((reader.paths.index(path), chunk, got[0].size + got[1]))
      return got
    reader.read_chunk = read
    feed = input_feed.InputFeed(data, c.train.batch_size, c.seed)
    batches = [next(feed) for _ in range(20)]
    position = feed.position_at(20)
    from sfjax.parallel import distributed
    assert not distributed.failed_processes(True)  # a barrier: all are done with the 1st feed
    again = make()
    resumed = input_feed.InputFeed(again, c.train.batch_size, c.seed, 12,
                                   json.loads(json.dumps(feed.position_at(12))))
    rebatches = [next(resumed) for _ in range(8)]
    np.savez(os.path.join(out, f"feed_p{pid}.npz"),
             **{f"{k}_{n}": np.stack([getattr(b, n) for b in got])
                for k, got in (("first", batches), ("resumed", rebatches))
                for n in ("ids", "weights", "labels")},
             parsed=reader.rows_parsed, seen=np.asarray(seen).reshape(-1, 3),
             cursor=[position["epoch"], position["file"], position["chunk"]],
             bad=data.stats["bad_lines"])
""").replace("CHUNK_ROWS", str(_PARQUET_CHUNK_ROWS))


def _check_parquet_feed(count, parquet_files, tmp_path):
  c = _parquet_config(parquet_files)
  ref = list(itertools.islice(_parquet_data(c).train_batches(_BATCH, c.seed), 20))
  runs, chunk = _launch_feed(_PARQUET_FEED_WORKER, c, count, tmp_path)  # into b.parquet
  for run in runs:  # the same global batches as 1 process, from the start and resumed
    for name, first in (("first", 0), ("resumed", 12)):
      for n in ("ids", "weights", "labels"):
        np.testing.assert_array_equal(run[f"{name}_{n}"], np.stack([getattr(b, n) for b in ref[first:]]))
  # Each chunk parsed by one process, (f + k) % P; nothing parsed twice; the rows of the
  # chunks taken in (before the cursor) add up to the rows consumed, bad ones included.
  seen = [run["seen"] for run in runs]
  for p, s in enumerate(seen):
    assert s.size and ((s[:, 0] + s[:, 1]) % count == p).all()
  _assert_chunks_parsed_once(runs, seen, chunk, 600 + chunk * _PARQUET_CHUNK_ROWS)
  assert sum(int(run["bad"]) for run in runs) >= 2  # rows 7 and 333, dropped by their owners


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_processes_parquet_feed_parses_each_row_once_and_resumes_by_seeking(parquet_files,
                                                                               tmp_path):
  _check_parquet_feed(2, parquet_files, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_four_processes_parquet_feed_parses_each_row_once(parquet_files, tmp_path):
  _check_parquet_feed(4, parquet_files, tmp_path)

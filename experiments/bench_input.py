"""Input throughput: Criteo text (parse + hash) versus preprocessed binary shards.

  python -m experiments.bench_input [--rows=1000000 --batch_size=4096 --out=input.json]

1. Writes `--rows` synthetic Criteo-like train rows (and `--eval_rows`) as TSV
   (`SyntheticCTR.write_criteo`) into `--workdir` (default: a temporary folder,
   removed at the end).
2. text: one pass of `FileCTRDataset.train_batches` (parse + hash, shuffle
   buffer 0) on the calling thread -> `text_lines_per_s`.
3. Preprocesses the files (`preprocessed.preprocess_files`) -> `preprocess_lines_per_s`.
4. binary, each `--repeats` times, `--binary_examples` examples of fixed-size
   batches (the shards are in the page cache: they were just written):
     reader     `ShardSplit.chunks(batch_size)`, file order (copies of map slices);
     plain      `PreprocessedDataset.train_batches`, shuffle_buffer 0 (file order,
                the text path's order) -> `binary_examples_per_s` (median);
     shuffled   the same with `--shuffle_buffer` (shard + block order shuffled,
                then the streaming buffer) -> `binary_shuffled_examples_per_s`.
   The dataset reads and batches on its background thread; the caller only
   counts, so these are the rates at which it can feed a trainer.
Ends stdout with one JSON line (also written to --out).
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time

from absl import app, flags

from experiments import report
from experiments.configs import ctr as ctr_config
from sfjax.data import dataset as dataset_lib
from sfjax.data import preprocessed, synthetic

_ROWS = flags.DEFINE_integer("rows", 1_000_000, "Train rows written as Criteo TSV.")
_EVAL_ROWS = flags.DEFINE_integer("eval_rows", 10_000, "Eval rows (preprocessing needs an eval split).")
_BATCH = flags.DEFINE_integer("batch_size", 4096, "Examples per batch.")
_HASH_ROWS = flags.DEFINE_integer("hash_rows", 1_000_000, "Hash rows per field.")
_ROWS_PER_SHARD = flags.DEFINE_integer("rows_per_shard", 1 << 18, "Examples per shard.")
_SHUFFLE = flags.DEFINE_integer("shuffle_buffer", 65536, "Shuffle buffer of the shuffled binary run.")
_BINARY_EXAMPLES = flags.DEFINE_integer("binary_examples", 20_000_000,
                                        "Examples per binary measurement (epochs repeat).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Binary measurements of each kind.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where the files go (default: a temporary folder).")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")


def _data_config(root: str):
  d = ctr_config.get_config().data
  d.format = "criteo"
  d.train_path, d.eval_path = os.path.join(root, "train.tsv"), os.path.join(root, "eval.tsv")
  d.hash_rows, d.shuffle_buffer = _HASH_ROWS.value, 0
  return d


def _rate(batches, num_examples: int) -> float:
  """Examples/s of taking batches until `num_examples` (iterator creation included)."""
  start = time.perf_counter()
  seen = 0
  for b in batches():
    seen += b.size
    if seen >= num_examples:
      break
  seconds = time.perf_counter() - start
  if seen < num_examples:
    raise RuntimeError(f"the stream ended after {seen} of {num_examples} examples")
  return seen / seconds


def write_text(root: str) -> float:
  """Writes train.tsv / eval.tsv; returns the seconds it took."""
  start = time.perf_counter()
  gen = synthetic.SyntheticCTR(ctr_config.get_config().data.synthetic, seed=0)
  gen.write_criteo(os.path.join(root, "train.tsv"), "train", _ROWS.value)
  gen.write_criteo(os.path.join(root, "eval.tsv"), "eval", _EVAL_ROWS.value)
  return time.perf_counter() - start


def measure(root: str) -> dict:
  """All figures of the benchmark on files under `root`."""
  batch = _BATCH.value
  write_seconds = write_text(root)
  data_cfg = _data_config(root)
  text = dataset_lib.make_dataset(data_cfg, seed=0)
  text_batches = _ROWS.value // batch
  if text_batches < 1:
    raise app.UsageError(f"--rows={_ROWS.value} is less than one batch of {batch}")
  text_rate = _rate(lambda: text.train_batches(batch, seed=0), text_batches * batch)

  out_dir = os.path.join(root, "preprocessed")
  start = time.perf_counter()
  meta = preprocessed.preprocess_files(data_cfg, out_dir, _ROWS_PER_SHARD.value)
  preprocess_seconds = time.perf_counter() - start

  pre_cfg = ctr_config.get_config().data
  pre_cfg.format, pre_cfg.train_path = "preprocessed", out_dir
  num_examples = max(1, _BINARY_EXAMPLES.value // batch) * batch
  runs = {"reader": [], "plain": [], "shuffled": []}
  for _ in range(_REPEATS.value):
    pre_cfg.shuffle_buffer = 0
    plain = dataset_lib.make_dataset(pre_cfg, seed=0)
    train = plain.split("train")
    epochs = lambda: itertools.chain.from_iterable(train.chunks(batch) for _ in itertools.count())
    runs["reader"].append(_rate(epochs, num_examples))
    runs["plain"].append(_rate(lambda: plain.train_batches(batch, seed=0), num_examples))
    pre_cfg.shuffle_buffer = _SHUFFLE.value
    shuffled = dataset_lib.make_dataset(pre_cfg, seed=0)
    runs["shuffled"].append(_rate(lambda: shuffled.train_batches(batch, seed=0), num_examples))

  train_dir = os.path.join(out_dir, "train")
  shard_bytes = sum(os.path.getsize(os.path.join(train_dir, f)) for f in os.listdir(train_dir)
                    if f.endswith(".npy"))
  text_bytes = os.path.getsize(data_cfg.train_path)
  binary = statistics.median(runs["plain"])
  return {
      "benchmark": "bench_input", "rows": _ROWS.value, "batch_size": batch,
      "hash_rows": _HASH_ROWS.value, "rows_per_shard": _ROWS_PER_SHARD.value,
      "num_shards": meta["splits"]["train"]["num_shards"], "shuffle_buffer": _SHUFFLE.value,
      "binary_examples": num_examples, "write_text_seconds": write_seconds,
      "text_bytes_per_example": text_bytes / _ROWS.value,
      "shard_bytes_per_example": shard_bytes / _ROWS.value,
      "text_lines_per_s": text_rate,
      "preprocess_lines_per_s": (_ROWS.value + _EVAL_ROWS.value) / preprocess_seconds,
      "binary_examples_per_s": binary,
      "binary_shuffled_examples_per_s": statistics.median(runs["shuffled"]),
      "reader_examples_per_s": statistics.median(runs["reader"]),
      "speedup_vs_text": binary / text_rate,
      "runs": runs,
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  root = _WORKDIR.value or tempfile.mkdtemp(prefix="bench_input_")
  os.makedirs(root, exist_ok=True)
  try:
    result = measure(root)
  finally:
    if not _WORKDIR.value:
      shutil.rmtree(root, ignore_errors=True)
  runs = result["runs"]
  print(f"text {result['text_lines_per_s']:.3g} lines/s | preprocess "
        f"{result['preprocess_lines_per_s']:.3g} lines/s | binary (examples/s) reader "
        f"{runs['reader']} plain {runs['plain']} shuffled {runs['shuffled']}", file=sys.stderr)
  report.emit_json_line(result, _OUT.value)


if __name__ == "__main__":
  app.run(main)

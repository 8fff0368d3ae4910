"""Input throughput: Criteo text (parse + hash) versus preprocessed binary shards.

  python -m experiments.bench_input [--config=experiments/configs/bench_input.py[:smoke]]
      [--config.rows=1000000 --config.batch_size=4096 --config.out=input.json]

1. Writes `rows` synthetic Criteo-like train rows (and `eval_rows`) as TSV
   (`SyntheticCTR.write_criteo`) into `workdir` (default: a temporary folder,
   removed at the end).
2. text: one pass of `FileCTRDataset.train_batches` (parse + hash, shuffle
   buffer 0) on the calling thread -> `text_lines_per_s`.
3. Preprocesses the files (`preprocessed.preprocess_files`) -> `preprocess_lines_per_s`.
4. binary, each `repeats` times, `binary_examples` examples of fixed-size
   batches (the shards are in the page cache: they were just written):
     reader     `ShardSplit.chunks(batch_size)`, file order (copies of map slices);
     plain      `PreprocessedDataset.train_batches`, shuffle_buffer 0 (file order,
                the text path's order) -> `binary_examples_per_s` (median);
     shuffled   the same with `shuffle_buffer` (shard + block order shuffled,
                then the streaming buffer) -> `binary_shuffled_examples_per_s`.
   The dataset reads and batches on its background thread; the caller only
   counts, so these are the rates at which it can feed a trainer.
`run(config)` returns the figures; the command prints a summary line to stderr and ends
stdout with the figures as one JSON line (also written to `config.out`).

Old flag -> config field: each `--X` is `--config.X` (rows, eval_rows, batch_size,
hash_rows, rows_per_shard, shuffle_buffer, binary_examples, repeats, workdir, out).
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time

import ml_collections

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.core import ConfigError
from sfjax.data import SyntheticCTR, make_dataset, preprocess_files


def _data_config(root: str, hash_rows: int):
  d = ctr_config.get_config().data
  d.format = "criteo"
  d.train_path, d.eval_path = os.path.join(root, "train.tsv"), os.path.join(root, "eval.tsv")
  d.hash_rows, d.shuffle_buffer = hash_rows, 0
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


def _epochs(split, batch_size: int):
  """Endless `split.chunks(batch_size)`, epoch after epoch (file order)."""
  return itertools.chain.from_iterable(split.chunks(batch_size) for _ in itertools.count())


def write_text(root: str, rows: int, eval_rows: int) -> float:
  """Writes train.tsv / eval.tsv; returns the seconds it took."""
  start = time.perf_counter()
  gen = SyntheticCTR(ctr_config.get_config().data.synthetic, seed=0)
  gen.write_criteo(os.path.join(root, "train.tsv"), "train", rows)
  gen.write_criteo(os.path.join(root, "eval.tsv"), "eval", eval_rows)
  return time.perf_counter() - start


def measure(config: ml_collections.ConfigDict, root: str) -> dict:
  """All figures of the benchmark on files under `root`."""
  batch = config.batch_size
  write_seconds = write_text(root, config.rows, config.eval_rows)
  data_cfg = _data_config(root, config.hash_rows)
  text = make_dataset(data_cfg, seed=0)
  text_rate = _rate(lambda: text.train_batches(batch, seed=0), config.rows // batch * batch)

  out_dir = os.path.join(root, "preprocessed")
  start = time.perf_counter()
  meta = preprocess_files(data_cfg, out_dir, config.rows_per_shard)
  preprocess_seconds = time.perf_counter() - start

  pre_cfg = ctr_config.get_config().data
  pre_cfg.format, pre_cfg.train_path = "preprocessed", out_dir
  num_examples = max(1, config.binary_examples // batch) * batch
  runs = {"reader": [], "plain": [], "shuffled": []}
  for _ in range(config.repeats):
    pre_cfg.shuffle_buffer = 0
    plain = make_dataset(pre_cfg, seed=0)
    epochs = functools.partial(_epochs, plain.split("train"), batch)
    runs["reader"].append(_rate(epochs, num_examples))
    runs["plain"].append(_rate(functools.partial(plain.train_batches, batch, seed=0), num_examples))
    pre_cfg.shuffle_buffer = config.shuffle_buffer
    shuffled = make_dataset(pre_cfg, seed=0)
    runs["shuffled"].append(_rate(functools.partial(shuffled.train_batches, batch, seed=0),
                                  num_examples))

  train_dir = os.path.join(out_dir, "train")
  shard_bytes = sum(os.path.getsize(os.path.join(train_dir, f)) for f in os.listdir(train_dir)
                    if f.endswith(".npy"))
  text_bytes = os.path.getsize(data_cfg.train_path)
  binary = statistics.median(runs["plain"])
  return {
      "benchmark": "bench_input", "rows": config.rows, "batch_size": batch,
      "hash_rows": config.hash_rows, "rows_per_shard": config.rows_per_shard,
      "num_shards": meta["splits"]["train"]["num_shards"], "shuffle_buffer": config.shuffle_buffer,
      "binary_examples": num_examples, "write_text_seconds": write_seconds,
      "text_bytes_per_example": text_bytes / config.rows,
      "shard_bytes_per_example": shard_bytes / config.rows,
      "text_lines_per_s": text_rate,
      "preprocess_lines_per_s": (config.rows + config.eval_rows) / preprocess_seconds,
      "binary_examples_per_s": binary,
      "binary_shuffled_examples_per_s": statistics.median(runs["shuffled"]),
      "reader_examples_per_s": statistics.median(runs["reader"]),
      "speedup_vs_text": binary / text_rate,
      "runs": runs,
  }


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: when `rows` is less than one batch, before any file is written.
  """
  if config.rows < config.batch_size:
    raise ConfigError(f"config field rows: {config.rows} is less than one batch of "
                      f"{config.batch_size}")
  root = config.workdir or tempfile.mkdtemp(prefix="bench_input_")
  os.makedirs(root, exist_ok=True)
  try:
    return measure(config, root)
  finally:
    if not config.workdir:
      shutil.rmtree(root, ignore_errors=True)


def print_summary(result: dict) -> None:
  """One line of the rates to stderr."""
  runs = result["runs"]
  print(f"text {result['text_lines_per_s']:.3g} lines/s | preprocess "
        f"{result['preprocess_lines_per_s']:.3g} lines/s | binary (examples/s) reader "
        f"{runs['reader']} plain {runs['plain']} shuffled {runs['shuffled']}", file=sys.stderr)


if __name__ == "__main__":
  cli.run_benchmark("bench_input", run, print_summary)

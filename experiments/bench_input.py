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
                then the streaming buffer, row by row) -> `binary_shuffled_examples_per_s`;
     block      the same with `data.shuffle=block` (blocks of `block_rows` in a random
                order, rows permuted within windows of `shuffle_buffer`; whole blocks
                read; one thread: the training default) -> `binary_block_examples_per_s`;
     block_ahead  the same with `data.shuffle_threads=2`: the next window copied (and
                every other window's permutation drawn) on a second thread (a second
                core) ->
                `binary_block_ahead_examples_per_s`.
   The dataset reads and batches on its background thread; the caller only
   counts, so these are the rates at which it can feed a trainer.
5. per-process input (issue #24), on the calling thread, the shuffled order:
     index      `train_order` + `read_train`: the trainer's reader by index, the
                whole global batch (one process) -> `index_examples_per_s`;
     index_half the rows `[0, B/2)` of each batch (process 0 of 2): examples it
                reads per second -> `index_half_examples_per_s`;
     index_block, index_block_half  the same in the block shuffle's order (its
                `BlockReader` keeps the blocks it copied) -> `index_block_examples_per_s`,
                `index_block_half_examples_per_s`;
     grain      Grain 0.2.18 (`grain.python.DataLoader`: `IndexSampler` shuffled,
                `ShardByJaxProcess`, `Batch`, no worker processes, `grain_threads`
                reading threads) over the same shard
                files as a `RandomAccessDataSource` -> `grain_examples_per_s` (None
                when grain is not installed).
6. the block shuffle's stages (`block_stages`), ns per example of this thread's CPU time
   (so other processes' load changes them less than the rates): copy (blocks into the
   window's arrays), permutation (the window's), gather (the batches gathered from the
   window and assembled) -> `block_stage_ns_per_example`.
7. resume by seeking: the input position after each of `seek_steps` batches of the
   shuffled order (reached by stepping the index order alone, timed:
   `index_replay_seconds`), then the start-up of a resumed trainer's input from it
   (`sfjax.train.InputFeed` from the position's JSON up to its first batch, median of 5):
   `resume_startup_seconds` per step count; it must not grow with the step.
Grain (issue #24) was evaluated here and not adopted: per-record `__getitem__` + `Batch`
runs at ~10^3-10^4 examples/s on these shards against ~10^6 for the vectorized reader by
index (`read_train`), which also gives exact resume and per-process reads (`input_feed`).

`run(config)` returns the figures; the command prints a summary line to stderr and ends
stdout with the figures as one JSON line (also written to `config.out`).

Old flag -> config field: each `--X` is `--config.X` (rows, eval_rows, batch_size,
hash_rows, rows_per_shard, shuffle_buffer, binary_examples, repeats, workdir, out);
`block_rows` is new (`data.shuffle_block_rows` of the block runs).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import statistics
import sys
import time

import ml_collections
import numpy as np

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.core import ConfigError
from sfjax.data import Batch, SyntheticCTR, make_dataset, preprocess_files
from sfjax.data.block_shuffle import BlockReader


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


class ShardSource:
  """A preprocessed split as Grain's `RandomAccessDataSource`: record i is example i
  (a dict of its ids [F], dense [Nd] and label), read from the shards' memory maps."""

  def __init__(self, split):
    self.split = split
    sizes = [s.num_examples for s in split.info.shards]
    self.starts = list(itertools.accumulate([0] + sizes[:-1]))
    self.size = sum(sizes)
    self._arrays: dict[int, object] = {}  # shard -> its opened maps (opened once)

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, index: int) -> dict:
    import bisect  # pylint: disable=import-outside-toplevel

    shard = bisect.bisect_right(self.starts, int(index)) - 1
    arrays = self._arrays.get(shard)
    if arrays is None:
      arrays = self._arrays.setdefault(shard, self.split.shard(shard))
    row = int(index) - self.starts[shard]
    return {"ids": arrays.ids[row], "dense": arrays.dense[row], "labels": arrays.labels[row]}


def grain_rate(split, batch_size: int, num_examples: int, threads: int = 16) -> float | None:
  """Examples/s of Grain's loader over `split` reading on `threads` threads (Grain's
  default 16; None: grain is not installed)."""
  try:
    from grain import python as grain  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  source = ShardSource(split)
  sampler = grain.IndexSampler(len(source), grain.ShardByJaxProcess(drop_remainder=True),
                               shuffle=True, num_epochs=None, seed=0)
  loader = grain.DataLoader(data_source=source, sampler=sampler,
                            operations=[grain.Batch(batch_size, drop_remainder=True)],
                            worker_count=0, read_options=grain.ReadOptions(num_threads=threads))
  return _rate(lambda: (Batch(b["ids"], b["dense"], b["labels"], np.ones_like(b["labels"]))
                       for b in loader),
               num_examples)


def index_rate(dataset, batch_size: int, num_examples: int, share: int = 1) -> float:
  """Examples/s read by `train_order` + `read_train`, rows [0, B/share) of each batch."""
  def batches():
    order = dataset.train_order(batch_size, seed=0)
    while True:
      yield dataset.read_train(order.next_batch()[:batch_size // share])
  return _rate(batches, num_examples // share)


class _TimedReader(BlockReader):
  """A `BlockReader` that sums the thread CPU seconds of its `window` calls."""

  def __init__(self, *args):
    super().__init__(*args)
    self.window_seconds = 0.0

  def window(self, *args, **kwargs):
    start = time.thread_time()
    try:
      return super().window(*args, **kwargs)
    finally:
      self.window_seconds += time.thread_time() - start


def block_stages(dataset, batch_size: int, num_examples: int) -> dict:
  """ns per example (thread CPU time) of the block shuffle's stages over `num_examples`
  examples of `dataset`'s order, on one thread: copy (`BlockReader.window` less its
  permutation, timed again after the run over as many whole windows), permutation,
  gather (the rest of `BlockReader.batches`: gathers and batch assembly), total."""
  split = dataset.split("train")
  shard = functools.lru_cache(maxsize=None)(split.shard)  # each shard's maps opened once
  reader = _TimedReader(split, shard, dataset.block_rows, 1)
  order = dataset.train_order(batch_size, seed=0)
  seen, start = 0, time.thread_time()
  for batch in reader.batches(order):
    seen += batch.size
    if seen >= num_examples:
      break
  total = time.thread_time() - start
  windows = -(-seen // (order.window_blocks * dataset.block_rows))  # about those read
  rows = [(w // order.num_windows, w % order.num_windows) for w in range(windows)]
  start = time.thread_time()
  for epoch, w in rows:
    order.permutation(epoch, w, order.window_blocks * dataset.block_rows)
  permutation = time.thread_time() - start
  ns = 1e9 / seen
  return {"copy": (reader.window_seconds - permutation) * ns, "permutation": permutation * ns,
          "gather": (total - reader.window_seconds) * ns, "total": total * ns}


def resume_startup(dataset, batch_size: int, steps: int) -> tuple[float, float]:
  """(seconds to reach the position after `steps` batches by stepping the index order,
  seconds from that position (its JSON text) to a resumed feed's first batch, the
  median of 5)."""
  from sfjax.train import InputFeed  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  order = dataset.train_order(batch_size, seed=0)
  for _ in range(steps):
    order.next_batch()
  replay = time.perf_counter() - start
  saved = json.dumps(order.position())  # as a checkpoint's meta holds it
  times = []
  for _ in range(5):  # the median of 5 restarts (the machine may be busy)
    start = time.perf_counter()
    next(InputFeed(dataset, batch_size, 0, steps, json.loads(saved)))
    times.append(time.perf_counter() - start)
  return replay, statistics.median(times)


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
  runs: dict[str, list] = {"reader": [], "plain": [], "shuffled": [], "block": [],
                          "block_ahead": [], "index": [], "index_half": [], "index_block": [],
                          "index_block_half": [], "grain": []}
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
    runs["index"].append(index_rate(shuffled, batch, num_examples))
    runs["index_half"].append(index_rate(shuffled, batch, num_examples, share=2))
    pre_cfg.shuffle, pre_cfg.shuffle_block_rows = "block", config.block_rows
    blocks = make_dataset(pre_cfg, seed=0)
    runs["block"].append(_rate(functools.partial(blocks.train_batches, batch, seed=0),
                               num_examples))
    pre_cfg.shuffle_threads = 2
    ahead = make_dataset(pre_cfg, seed=0)
    runs["block_ahead"].append(_rate(functools.partial(ahead.train_batches, batch, seed=0),
                                     num_examples))
    pre_cfg.shuffle_threads = 1
    runs["index_block"].append(index_rate(blocks, batch, num_examples))
    runs["index_block_half"].append(index_rate(blocks, batch, num_examples, share=2))
    pre_cfg.shuffle = "buffer"
    runs["grain"].append(grain_rate(shuffled.split("train"), batch,
                                    min(num_examples, config.grain_examples), config.grain_threads))

  stages = block_stages(blocks, batch, num_examples)
  shuffled.split("train").verify()  # every shard checked once: the seeks time only the seek
  seeks = {int(n): resume_startup(shuffled, config.seek_batch_size, int(n))
           for n in config.seek_steps}

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
      "block_rows": config.block_rows,
      "binary_block_examples_per_s": statistics.median(runs["block"]),
      "binary_block_ahead_examples_per_s": statistics.median(runs["block_ahead"]),
      "block_stage_ns_per_example": stages,
      "reader_examples_per_s": statistics.median(runs["reader"]),
      "speedup_vs_text": binary / text_rate,
      "index_examples_per_s": statistics.median(runs["index"]),
      "index_half_examples_per_s": statistics.median(runs["index_half"]),
      "index_block_examples_per_s": statistics.median(runs["index_block"]),
      "index_block_half_examples_per_s": statistics.median(runs["index_block_half"]),
      "grain_examples_per_s": (None if None in runs["grain"] else statistics.median(runs["grain"])),
      "seek_batch_size": config.seek_batch_size,
      "index_replay_seconds": {str(n): r for n, (r, _) in seeks.items()},
      "resume_startup_seconds": {str(n): t for n, (_, t) in seeks.items()},
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
  return cli.in_workdir(config.workdir, "bench_input_", lambda root: measure(config, root))


def print_summary(result: dict) -> None:
  """One line of the rates to stderr."""
  runs = result["runs"]
  print(f"text {result['text_lines_per_s']:.3g} lines/s | preprocess "
        f"{result['preprocess_lines_per_s']:.3g} lines/s | binary (examples/s) reader "
        f"{runs['reader']} plain {runs['plain']} shuffled {runs['shuffled']} block "
        f"{runs['block']} ahead {runs['block_ahead']} by index {runs['index']} half "
        f"{runs['index_half']} block "
        f"{runs['index_block']} half {runs['index_block_half']} grain {runs['grain']} | "
        f"resume start-up (s) {result['resume_startup_seconds']}", file=sys.stderr)


if __name__ == "__main__":
  cli.run_benchmark("bench_input", run, print_summary)

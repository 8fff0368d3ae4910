"""Text input (Criteo TSV): the chunked feed against the stream, and resume by seeking.

  python -m experiments.bench_text_input [--config=experiments/configs/bench_text_input.py[:smoke]]

1. Writes `rows` synthetic Criteo lines (`SyntheticCTR.write_criteo`) into `workdir`
   (default: a temporary folder, removed at the end).
2. `chunk_index_seconds`: the chunk index of the file (`text_io.chunk_offsets`, one newline
   scan), which a process needs to parse its own chunks (8192 lines each: `chunks`).
3. Rates on the calling thread, one process, `rate_batches` batches of `batch_size`
   through the shuffle buffer: `stream_lines_per_s` (`FileCTRDataset.train_batches`, the
   stream every process used to read whole) and `feed_lines_per_s` (`train.InputFeed` on
   text: `chunk_feed`, chunk by chunk, the same batches, and a position per batch; with P
   processes each parses 1/P of the chunks).
4. Resume by seeking: the feed is stepped `seek_steps` batches of `seek_batch_size`
   (`replay_seconds`: what a resume by replay would cost), then restarted from the
   position's JSON up to its first batch (`resume_startup_seconds`, the median of
   `repeats`; `resume_lines_parsed`: the lines the restart parsed, those of the rows
   waiting in the shuffle buffer). The start-up must not grow with the step.

`run(config)` returns the figures; the command prints a summary line to stderr and ends
stdout with the figures as one JSON line (also written to `config.out`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import ml_collections

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.core import ConfigError
from sfjax.data import SyntheticCTR, make_dataset
from sfjax.train import InputFeed


def _dataset(root: str, config: ml_collections.ConfigDict):
  d = ctr_config.get_config().data
  d.format, d.hash_rows, d.shuffle_buffer = "criteo", config.hash_rows, config.shuffle_buffer
  d.train_path, d.eval_path = os.path.join(root, "train.tsv"), os.path.join(root, "eval.tsv")
  return make_dataset(d, seed=0)


def _lines_per_s(next_batch, batches: int, batch_size: int) -> float:
  start = time.perf_counter()
  for _ in range(batches):
    next_batch()
  return batches * batch_size / (time.perf_counter() - start)


def resume_startup(root: str, config: ml_collections.ConfigDict, steps: int) -> dict:
  """Replay seconds to `steps`, then the restart's median seconds and lines parsed."""
  batch = config.seek_batch_size
  feed = InputFeed(_dataset(root, config), batch, 0)
  start = time.perf_counter()
  for _ in range(steps):
    next(feed)
  replay = time.perf_counter() - start
  saved = json.dumps(feed.position_at(steps))  # as a checkpoint's meta holds it
  times, parsed = [], 0
  for _ in range(config.repeats):
    data = _dataset(root, config)
    data.train_reader.num_chunks(data.paths["train"][0])  # the index, not timed (item 2)
    start = time.perf_counter()
    next(InputFeed(data, batch, 0, steps, json.loads(saved)))
    times.append(time.perf_counter() - start)
    parsed = data.train_reader.lines_parsed
  return {"replay_seconds": replay, "startup_seconds": statistics.median(times),
          "lines_parsed": parsed, "position_bytes": len(saved)}


def measure(config: ml_collections.ConfigDict, root: str) -> dict:
  """All figures of the benchmark on files under `root`."""
  gen = SyntheticCTR(ctr_config.get_config().data.synthetic, seed=0)
  gen.write_criteo(os.path.join(root, "train.tsv"), "train", config.rows)
  gen.write_criteo(os.path.join(root, "eval.tsv"), "eval", 100)
  data = _dataset(root, config)
  start = time.perf_counter()
  chunks = data.train_reader.num_chunks(data.paths["train"][0])  # builds the chunk index
  index_seconds = time.perf_counter() - start
  batch, batches = config.batch_size, config.rate_batches
  stream = _dataset(root, config).train_batches(batch, 0)
  stream_rate = _lines_per_s(lambda: next(stream), batches, batch)
  feed = InputFeed(data, batch, 0)  # the trainer's input: the chunked feed and its positions
  feed_rate = _lines_per_s(lambda: next(feed), batches, batch)
  seeks = {int(n): resume_startup(root, config, int(n)) for n in config.seek_steps}
  return {
      "benchmark": "bench_text_input", "rows": config.rows, "batch_size": batch,
      "shuffle_buffer": config.shuffle_buffer, "chunks": int(chunks),
      "chunk_index_seconds": index_seconds,
      "stream_lines_per_s": stream_rate, "feed_lines_per_s": feed_rate,
      "seek_batch_size": config.seek_batch_size,
      "replay_seconds": {str(n): s["replay_seconds"] for n, s in seeks.items()},
      "resume_startup_seconds": {str(n): s["startup_seconds"] for n, s in seeks.items()},
      "resume_lines_parsed": {str(n): s["lines_parsed"] for n, s in seeks.items()},
      "position_bytes": {str(n): s["position_bytes"] for n, s in seeks.items()},
  }


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: `rows` is less than one batch, before any file is written.
  """
  if config.rows < config.batch_size:
    raise ConfigError(f"config field rows: {config.rows} is less than one batch of "
                      f"{config.batch_size}")
  return cli.in_workdir(config.workdir, "bench_text_input_", lambda root: measure(config, root))


def print_summary(result: dict) -> None:
  """One line of the figures to stderr."""
  print(f"stream {result['stream_lines_per_s']:.3g} lines/s | feed "
        f"{result['feed_lines_per_s']:.3g} lines/s | resume start-up (s) "
        f"{result['resume_startup_seconds']} parsing {result['resume_lines_parsed']} lines",
        file=sys.stderr)


if __name__ == "__main__":
  cli.run_benchmark("bench_text_input", run, print_summary)

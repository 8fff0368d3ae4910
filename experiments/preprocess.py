"""Preprocess text or Parquet CTR logs once into binary shards: `python -m experiments.preprocess`.

  python -m experiments.preprocess --config=experiments/configs/ctr.py \\
      --config.data.format=criteo --config.data.train_path='/d/day_*.gz' \\
      --config.data.eval_path=/d/eval.gz [--config.data.test_path=...] \\
      --config.data.hash_rows=1000000 | --config.data.min_count=10   --out=DIR [--overwrite]

Parquet: --config.data.format=parquet with the columns of `data.parquet`; list columns
(`data.parquet.bags`: bags and sequences) and shared tables are written as one-hot ids
plus each bag's values + offsets (`sfjax/data/bag_shards.py`), and read back as the very
batches the Parquet files give (ids padded with -1, per-id weights).
Then train from DIR with `--config.data.format=preprocessed --config.data.train_path=DIR`.
The mapping is the one training from the text files builds (hashing, or the
one-pass vocabulary); DIR's layout is described in `sfjax/data/preprocessed.py`.
Ends stdout with one JSON line (spec.json's summary plus the time taken). Errors print
one line `error: ...` (exit 2 for a bad flag, config or path, 1 otherwise); `--verbose`
adds the traceback.
"""

import time

from absl import app, flags, logging
from ml_collections import config_flags

from experiments import cli, report
from sfjax.data import DEFAULT_ROWS_PER_SHARD, preprocess_files
from sfjax.train import check_paths


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  check_paths(_CONFIG.value)  # a missing file, or a directory where files go, named
  start = time.perf_counter()
  meta = preprocess_files(_CONFIG.value.data, _OUT.value, _ROWS_PER_SHARD.value,
                          _OVERWRITE.value)
  seconds = time.perf_counter() - start
  lines = sum(s["num_examples"] + s["bad_lines"] for s in meta["splits"].values())
  report.emit_json_line({"out": _OUT.value, "source_format": meta["source"]["format"],
                         "mapping": meta["mapping"]["kind"], "splits": meta["splits"],
                         "field_rows": [f["num_rows"] for f in meta["fields"]],
                         "seconds": seconds, "lines_per_s": lines / max(seconds, 1e-9)})


if __name__ == "__main__":
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Python config file (ml_collections).",
                                            lock_config=True)
  _OUT = flags.DEFINE_string("out", None, "Output directory DIR (must be new or empty).")
  _ROWS_PER_SHARD = flags.DEFINE_integer("rows_per_shard", DEFAULT_ROWS_PER_SHARD,
                                         "Examples per shard file.")
  _OVERWRITE = flags.DEFINE_boolean("overwrite", False, "Replace an earlier preprocessing in DIR.")
  flags.mark_flags_as_required(["config", "out"])
  cli.run_main(main)

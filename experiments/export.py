"""Export a run's trained table: `python -m experiments.export --workdir=DIR --out=DIR2`.

With `--serving [--dtype=float32|float16|int8] [--table_storage=auto|dense|lazy]`, writes the
run's serving bundle instead (`sfjax.serving.write_bundle`: the exported forward, dense
params, table chunks, feature mapping and manifest; a cache-backend run on an mmap host
table, or one with fewer than half its rows written, gets a lazy table: its written rows
and the rule for the others, `sfjax.serving.lazy_table`), which `sfjax.serving.Predictor.load(DIR2)` scores and
`python -m experiments.predict --bundle=DIR2` / `experiments.serve` serve.

Writes the newest good checkpoint's embedding rows, their optimizer slots (separately),
the per-field row ranges and the feature mapping as `.npy` chunks plus `export.json`,
readable with numpy alone (format: `sfjax/checkpoint/export.py`). Prints the manifest's
summary as one JSON line.
"""

import json
import os

from absl import app, flags, logging

from experiments import cli
from sfjax.checkpoint import export_checkpoint
from sfjax.core import hold_workdir


def serving_summary(manifest: dict, out: str) -> dict:
  """The one-line summary of a written serving bundle."""
  table = manifest["tables"][0]
  storage = table.get("storage", "dense")
  return {"out": out, "format": manifest["format"], "model": manifest["model"],
          "step": manifest["step"], "dtype": table["dtype"], "num_rows": table["rows"],
          "table_storage": storage,
          "stored_rows": table["written"]["rows"] if storage == "lazy" else table["rows"],
          "width": table["dim"], "num_fields": len(manifest["features"]),
          "mapping": manifest["mapping"]["kind"], "files": len(manifest["files"]),
          "metrics": manifest["metrics"]}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  if not os.path.isdir(_WORKDIR.value):
    raise FileNotFoundError(f"--workdir={_WORKDIR.value}: no such run directory")
  # The run's owner: an export never reads a checkpoint that a live run is still writing.
  with hold_workdir(_WORKDIR.value, "experiments.export"):
    summary = _export()
  print(json.dumps(summary, sort_keys=True))


def _export() -> dict:
  """Writes the bundle or the table export; returns its one-line summary."""
  if _SERVING.value:
    from sfjax.serving import write_bundle  # the model code loads only for a bundle
    manifest = write_bundle(_WORKDIR.value, _OUT.value, dtype=_DTYPE.value,
                            checkpoint=_CHECKPOINT.value or None,
                            table_storage=_TABLE_STORAGE.value)
    return serving_summary(manifest, _OUT.value)
  manifest = export_checkpoint(_WORKDIR.value, _OUT.value, _CHECKPOINT.value or None)
  summary = {k: manifest[k] for k in ("step", "checkpoint", "num_rows", "width", "slot_width",
                                      "field_names", "field_offsets")}
  summary.update(out=_OUT.value, mapping=manifest["mapping"]["kind"],
                 files=len(manifest["values"]) + len(manifest["slots"]))
  return summary


if __name__ == "__main__":
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (config.json, checkpoints/).")
  _OUT = flags.DEFINE_string("out", None, "Output directory (created; must be new or empty).")
  _CHECKPOINT = flags.DEFINE_string("checkpoint", "", "A checkpoints/step_N directory (default: "
                                    "the newest good one).")
  _SERVING = flags.DEFINE_bool("serving", False, "Write a serving bundle (sfjax.serving) instead "
                               "of the numpy table export.")
  _DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "float16", "int8"], "--serving: "
                             "table storage (int8: per-row symmetric scales).")
  _TABLE_STORAGE = flags.DEFINE_enum(
      "table_storage", "auto", ["auto", "dense", "lazy"], "--serving: 'lazy' stores only the "
      "rows training wrote plus the rule for the others (cache backend); 'auto': lazy for an "
      "mmap host table or one with fewer than half its rows written.")
  flags.mark_flags_as_required(["workdir", "out"])
  cli.run_main(main)

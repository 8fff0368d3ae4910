"""Export a run's trained table: `python -m experiments.export --workdir=DIR --out=DIR2`.

Writes the newest good checkpoint's embedding rows, their optimizer slots (separately),
the per-field row ranges and the feature mapping as `.npy` chunks plus `export.json`,
readable with numpy alone (format: `sfjax/checkpoint/export.py`). Prints the manifest's
summary as one JSON line.
"""

import json

from absl import app, flags, logging

from sfjax.checkpoint import export_checkpoint


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  manifest = export_checkpoint(_WORKDIR.value, _OUT.value, _CHECKPOINT.value or None)
  summary = {k: manifest[k] for k in ("step", "checkpoint", "num_rows", "width", "slot_width",
                                      "field_names", "field_offsets")}
  summary.update(out=_OUT.value, mapping=manifest["mapping"]["kind"],
                 files=len(manifest["values"]) + len(manifest["slots"]))
  print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (config.json, checkpoints/).")
  _OUT = flags.DEFINE_string("out", None, "Output directory (created; must be new or empty).")
  _CHECKPOINT = flags.DEFINE_string("checkpoint", "", "A checkpoints/step_N directory (default: "
                                    "the newest good one).")
  flags.mark_flags_as_required(["workdir", "out"])
  app.run(main)

"""Batch scoring with a serving bundle: `python -m experiments.predict --bundle=B --input=GLOB
--out=FILE.npy [--format=criteo|avazu|preprocessed|jsonl]`.

Streams the input in order (Criteo / Avazu text, .gz allowed, through the training readers
`sfjax.data.text_io`; preprocessed split directories, `sfjax.data.shards`; or JSON lines,
one record per line with an optional `label`, the default for a bundle whose records are
ids: synthetic or multi-hot data, lists of ids for bags and sequences), scores it
with `sfjax.serving.Predictor` and writes the probabilities, float32 [n] in input order, as
`.npy`. Prints progress lines, then one JSON line: `examples`, `seconds`,
`examples_per_sec` and, the input having labels, `auc` and `logloss`.

  python -m experiments.export --workdir=/tmp/ctr --serving --out=/tmp/bundle
  python -m experiments.predict --bundle=/tmp/bundle --input='day_23*.tsv' --out=/tmp/s.npy
"""

import json

from absl import app, flags

from experiments import cli
from sfjax.serving import SCORING_FORMATS, score_files


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  summary = score_files(_BUNDLE.value, _INPUT.value, _OUT.value, _FORMAT.value or None)
  print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
  # Flags are defined only when run as a script (house rule, see experiments/export.py).
  _BUNDLE = flags.DEFINE_string("bundle", None, "The serving bundle (experiments.export "
                                "--serving).")
  _INPUT = flags.DEFINE_string("input", None, "Comma-separated globs of input files (.gz ok), "
                               "or preprocessed split directories.")
  _OUT = flags.DEFINE_string("out", None, "Scores file (.npy, float32, input order).")
  _FORMAT = flags.DEFINE_enum("format", "", ["", *SCORING_FORMATS], "Input format (default: the "
                              "bundle's record format).")
  flags.mark_flags_as_required(["bundle", "input", "out"])
  cli.run_main(main, usage=(ValueError,))

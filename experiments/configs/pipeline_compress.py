"""Config for `python -m experiments.pipeline`: train the baseline CNN, then compress it.

Run:
  python -m experiments.pipeline --config=experiments/configs/pipeline_compress.py --workdir=/tmp/cp
  python -m experiments.pipeline --config=experiments/configs/pipeline_compress.py:smoke \\
      --workdir=/tmp/cp_smoke

Steps: fully_train (the baseline CNN with the recipe, weights saved) -> compress
(Prune-EA: evolved channel / neuron keep-masks; Quant-EA: evolved per-layer bit
widths with fake-quant fine-tuning; every population fine-tuned as one vmap,
accuracy up vs parameters / weight bits down). The report carries each method's
Pareto front (size ratio, valid and test accuracy per point) and, as
`final_test_accuracy`, the test accuracy of the smallest pruned network within
`max_accuracy_drop` of the trained network's valid accuracy, against the
uncompressed network's `baseline_test_accuracy`.

Variants: '' (full), 'smoke' (well under a minute on 2 CPU cores), 'mnist'.
"""

import ml_collections

from experiments.configs import pipeline_digits


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the pipeline config; `arg` selects a variant ('', 'smoke', 'mnist')."""
  c = pipeline_digits.shared(arg)
  smoke = arg == "smoke"
  c.pipeline.order = "fully_train,compress"
  c.steps.fully_train = ml_collections.ConfigDict({"type": "fully_train"})
  c.steps.compress = ml_collections.ConfigDict({
      "type": "compress", "methods": "prune,quant", "population": 4 if smoke else 16,
      "generations": 1 if smoke else 8, "finetune_steps": 15 if smoke else 150,
      "finetune_lr": 1e-3, "mutation_rate": 0.1, "bit_choices": (2, 4, 8),
      "max_accuracy_drop": 0.02})
  return c

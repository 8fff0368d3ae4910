"""Config for `python -m experiments.pipeline`: train a DeepFM, then compress it (Prune-EA).

Run:
  python -m experiments.pipeline --config=experiments/configs/pipeline_ctr_compress.py \\
      --workdir=/tmp/ctr_compress
  python -m experiments.pipeline --config=experiments/configs/pipeline_ctr_compress.py:smoke \\
      --workdir=/tmp/ctr_compress_smoke

Steps: train (a `baseline` step: the recipe's DeepFM through the CTR trainer,
checkpointed, scored on the test split) -> compress (Prune-EA / Quant-EA on the
trained model: keep-masks over the MLP's hidden neurons, one kept latent dim k for
every field, the table's bits per value; every generation fine-tuned as one vmap
from the trained weights, valid AUC up vs exact stored bits down; the pick
physically pruned and quantized). The data,
seed and report blocks are those of `pipeline_ctr.py` (synthetic Criteo-like
rows from a planted FM, a separate test split). The compress step reports
`baseline_test_auc` (the trained model), `final_test_auc` (the pick) and
`size_ratio` (parameters) / `bits_ratio` (stored bits); its output holds the Pareto front
and `serving_bundle` (`steps/1_compress/bundle`: the pick's int8 serving bundle, for
`python -m experiments.serve --bundle=...` or `sfjax.serving.Predictor.load`).

Variants: '' (full: minutes on CPU), 'smoke' (under a minute on 2 CPU cores; run by
tests/experiments/pipeline_ctr_compress_test.py).
"""

import ml_collections

from experiments.configs import pipeline_ctr


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the pipeline config; `arg` selects a variant ('' or 'smoke')."""
  c = pipeline_ctr.get_config(arg)  # raises for an unknown variant
  smoke = arg == "smoke"
  c.pipeline.order = "train,compress"
  # The compression search prunes and quantises the dense part too: keep the data's dense
  # features (pipeline_ctr's smoke data drops them for its short search trials).
  c.task.data.synthetic.num_dense = 13
  # pipeline_ctr's overrides of the library's recipe, with a smaller DeepFM (the default model).
  recipe = c.steps.fully_train.to_dict().get("trainer", {})
  recipe["model"] = {"embed_dim": 8 if smoke else 16,
                     "mlp_dims": (32, 16) if smoke else (256, 128)}
  c.steps = st = ml_collections.ConfigDict()
  # A `baseline` step whose recipe is its own: the unsearched DeepFM, trained and checkpointed.
  st.train = ml_collections.ConfigDict({"type": "baseline", "recipe_step": "train",
                                        "trainer": recipe})
  st.compress = ml_collections.ConfigDict({
      "type": "compress",
      "population": 8 if smoke else 16,  # genomes per generation (one vmapped fine-tune)
      "generations": 4 if smoke else 8,
      "finetune_steps": 20 if smoke else 200,
      "batch_size": 256 if smoke else 1024,
      "finetune_lr": 1e-3,
      "mutation_rate": 0.1,
      "dim_choices": (),  # kept latent dims k; () = 1..embed_dim
      "bit_choices": (4, 8, 32),  # table bits per value (row-wise codes + scale); 32 = float
      "max_auc_drop": 0.005,  # the pick: smallest front point within this of the trained valid AUC
      "valid_rows": 4096 if smoke else 0,  # first rows of 'eval' to select on (0: all)
      "tune_table": True,  # fine-tune each candidate's copy of the table too
  })
  return c

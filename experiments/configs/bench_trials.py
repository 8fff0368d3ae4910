"""Config of `python -m experiments.bench_trials`: trials/hour of vmapped cohorts vs sequential.

Run:
  python -m experiments.bench_trials --config=experiments/configs/bench_trials.py \\
      [--config.widths=1,8,32,128 --config.steps=20 --config.joint=48 --config.out=bench.json]
  python -m experiments.bench_trials --config=experiments/configs/bench_trials.py:smoke

  python -m experiments.bench_trials --config=experiments/configs/bench_trials.py:dispatch \
      [--config.workers=4 --config.dispatch_trials=32 --config.dispatch_algorithm=asha]

Variants (the text after ':'): '' (cohorts of 1, 8, 32 and 128 DeepFM trials of 20 steps),
'smoke' (seconds: FM cohorts of 1 and 2, 3 steps, and 3 trials of the joint space),
'dispatch' (only the schedules: an ASHA search of 32 trials over 4 families on 4 Dask
workers, in rounds and asynchronously), 'dispatch_smoke' (the same on 2 workers, 6 trials
of 3 steps per budget unit over 3 families).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.widths = (1, 8, 32, 128)  # cohort sizes N to measure
  c.steps = 20  # train steps per trial
  c.batch_size = 128  # examples per train step
  c.model = "deepfm"  # model name
  c.embed_dim = 4  # embedding dimension D
  c.mlp_depth = 1  # MLP hidden layers
  c.mlp_width = 16  # MLP hidden width
  c.embedding_optimizer = "adagrad"  # row optimizer
  c.cardinality_scale = 1e-3  # synthetic Criteo cardinality scale (table size)
  c.eval_rows = 2048  # eval examples per trial
  c.shard_trials = False  # shard the trial axis over all local devices
  c.xla_cpu_dots = "auto"  # the cohort programs' CPU dots: auto | eigen | xla (CTRTask.xla_cpu_dots)
  c.joint = 0  # also this many trials of the default joint space
  c.joint_batch = 8  # trials asked per round in `joint`
  c.joint_fill = True  # `joint` rounds are architecture-aware (one shape bucket per round)
  # A search per schedule, synchronous rounds vs asynchronous (`study.dispatch`): '' (off),
  # 'dask' (a LocalCluster of `workers` processes) or 'local' (one slot).
  c.executor = ""
  c.workers = 4  # Dask workers (one thread each)
  c.dispatch_trials = 32  # trials of each search
  c.dispatch_algorithm = "asha"  # its algorithm (asynchronous ones: sfjax/ctr_search/dispatch.py)
  c.dispatch_families = "lr,fm,deepfm,wide_deep"  # model families: one shape bucket each
  c.dispatch_width = 4  # study.cohort_width
  c.dispatch_ask_batch = 8  # study.ask_batch: trials per ask (a round)
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.widths, c.steps, c.cardinality_scale, c.eval_rows, c.model = (1, 2), 3, 1e-4, 256, "fm"
    c.joint, c.joint_batch = 3, 3
  elif arg == "dispatch":
    c.widths, c.executor = (), "dask"
  elif arg == "dispatch_smoke":
    c.widths, c.executor, c.workers, c.steps, c.cardinality_scale, c.eval_rows = (), "dask", 2, \
        3, 1e-4, 256
    c.dispatch_trials, c.dispatch_families, c.dispatch_ask_batch = 6, "lr,fm,deepfm", 4
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke', 'dispatch', "
                     "'dispatch_smoke')")
  return c

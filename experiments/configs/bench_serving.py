"""Config of `python -m experiments.bench_serving`: the HTTP endpoint under load, and in-process.

Run:
  python -m experiments.bench_serving --config=experiments/configs/bench_serving.py
  python -m experiments.bench_serving --config.mode=inprocess
  python -m experiments.bench_serving --config.mode=inprocess \
      --config.compiler_options=xla_cpu_prefer_vector_width=512   # XLA options, predictor only
  python -m experiments.bench_serving --config.bundle=BUNDLE --config.mode=http
  python -m experiments.bench_serving --config=experiments/configs/bench_serving.py:smoke
  python -m experiments.bench_serving --config.mode=huge   # a lazy ~1.01e9-row table
  python -m experiments.bench_serving --config=experiments/configs/bench_serving.py:huge_smoke

Variants (the text after ':'): '' (issue #23's workload: DeepFM, 26 fields x 100k hashed
rows, dim 16, MLP 400-400-400, trained a few steps on synthetic Criteo lines; HTTP at
concurrency 1, 4, 8, 16 and 32 with 1 and 64 examples per request, 10 s per level, with
the raw HTTP/1.1 client (`--config.client=raw,httpx` adds httpx's levels), then 60 s at
concurrency 16; in-process at batch 1, 64, 4096 beside the training step), 'smoke'
(seconds: 26 fields x 100 rows, dim 4, MLP 16, levels of 1 s with both clients, a long
run of 2 s, no training step), 'huge_smoke' (mode=huge on a ~34k-row lazy table: the same code path in
seconds). Mode 'huge' trains `bench_huge_table`'s ~1.01e9-row workload for
`huge_train_steps` steps (its checkpoint writes the ~15k touched chunks: minutes), then
serves the lazy bundle in a fresh process.
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.mode = "both"  # http | inprocess | both | huge
  c.bundle = ""  # serve this bundle; '' = train the workload below and export it
  # ---- the model behind the bundle (trained `train_steps` steps on Criteo-format lines)
  c.model = "deepfm"
  c.rows_per_field = 100_000  # hashed rows per field
  c.embed_dim = 16
  c.mlp_dims = (400, 400, 400)
  c.train_steps = 4  # steps trained before export (the figures need a bundle, not a model)
  c.train_batch_size = 4096
  c.train_lines = 32_768  # synthetic Criteo lines written for training
  c.request_lines = 8_192  # distinct lines the requests draw from (held-out split)
  # ---- HTTP load (the server runs in a subprocess on 127.0.0.1, a free port)
  c.concurrency = (1, 4, 8, 16, 32)  # concurrent clients per level
  c.peak_concurrency = 16  # ... and of the long run (peak_duration_s)
  c.request_sizes = (1, 64)  # examples per request
  c.duration_s = 10.0  # seconds per level (bounded by max_requests too)
  c.peak_duration_s = 60.0  # seconds of the long run (no errors, no lost requests)
  c.max_requests = 1_000_000  # requests per level, at most
  c.warmup_s = 1.0  # untimed load before each level
  c.request_timeout_s = 10.0  # a request unanswered this long is lost
  c.startup_timeout_s = 300.0  # the server loads the bundle and compiles every batch size
  c.client = "raw"  # load client(s): raw (HTTP/1.1 on asyncio streams), httpx, or "raw,httpx"
  c.server_http, c.server_loop = "httptools", "uvloop"  # uvicorn's HTTP parser and event loop
  c.max_batch = 256  # the server's batcher: examples per predictor call
  c.max_delay_ms = 0.0  # ... and the longest wait for a batch to fill (0: none)
  c.server_batch_sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 4096)  # compiled at start-up
  # ---- in-process (no HTTP): Predictor.predict_features, and the training step
  c.inprocess_batch_sizes = (1, 64, 4096)
  c.inprocess_seconds = 3.0  # per batch size (bounded by inprocess_reps too)
  c.inprocess_reps = 2_000
  c.inprocess_host_gather = True  # also time the host-gather path (device_table=False)
  c.compiler_options = ""  # XLA options of the predictor's compiles: "xla_cpu_<name>=<value>,..."
  c.train_step = True  # also time the training step (experiments/bench_train.py) for the ratio
  c.train_step_steps = 20  # its timed steps
  # ---- huge mode: a lazily initialised ~1.01e9-row table (bench_huge_table's workload)
  c.huge_cardinality_scale = 30.0  # x Criteo's cardinalities: ~1.01e9 rows
  c.huge_train_steps = 8  # steps trained (cache backend, mmap host table) before export
  c.huge_train_batch_size = 4096
  c.huge_train_cache_rows = 400_000  # the trainer's device cache
  c.huge_request_examples = 262_144  # held-out examples replayed (each once) as requests
  c.huge_batch_sizes = (64, 4096)  # request sizes served
  c.huge_cache_rows = 0  # the predictor's device row cache (0: 4 x 4096 x 26 rows)
  c.out = ""  # also write the JSON result here
  if arg in ("smoke", "huge_smoke"):
    c.rows_per_field, c.embed_dim, c.mlp_dims = 100, 4, (16,)
    c.train_steps, c.train_batch_size, c.train_lines, c.request_lines = 2, 64, 512, 256
    c.concurrency, c.peak_concurrency = (1, 4), 4
    c.client = "raw,httpx"  # both clients' code paths
    c.duration_s, c.peak_duration_s, c.warmup_s = 1.0, 2.0, 0.2
    c.max_requests = 2_000
    c.server_batch_sizes = (1, 8, 64, 256)
    c.inprocess_batch_sizes, c.inprocess_seconds, c.inprocess_reps = (1, 64), 0.5, 50
    c.train_step = False
  if arg == "huge_smoke":
    c.mode, c.huge_cardinality_scale, c.huge_train_steps = "huge", 1e-3, 2
    c.huge_train_batch_size, c.huge_train_cache_rows, c.huge_request_examples = 64, 20_000, 2_048
    c.huge_batch_sizes, c.huge_cache_rows = (64, 256), 4 * 256 * 26
  elif arg and arg != "smoke":
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke', 'huge_smoke')")
  return c

"""Default CTR training config (the library's defaults; `experiments/configs/ctr.py` adds variants).

Every field of the `--config.x=y` interface of `python -m experiments.train_ctr` is
defined here, with a comment. Library code that needs a default (e.g. the AutoML
architecture spec) reads it from here, never from `experiments/`.
"""

import ml_collections


def ctr_defaults() -> ml_collections.ConfigDict:
  """Returns a fresh ConfigDict with every CTR training field at its default."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  # ---- data -------------------------------------------------------------
  c.data = d = ml_collections.ConfigDict()
  d.format = "synthetic"  # synthetic|multihot|criteo|avazu|parquet|movielens|preprocessed (DIR)
  d.train_path = ""  # glob(s), comma separated; .gz read transparently; preprocessed: the DIR
  d.eval_path = ""
  d.test_path = ""  # optional second held-out split
  d.hash_rows = 0  # >0: hash each field into this many rows
  d.min_count = 1  # hash_rows == 0: vocabulary of values seen >= min_count times (+1 OOV row)
  d.skip_bad_lines = False  # False: a malformed line raises, naming file and line
  d.shuffle_buffer = 65536  # examples; streaming shuffle for file formats
  d.shuffle = "buffer"  # buffer: the streaming buffer above | block (format preprocessed): blocks
  #                      of shuffle_block_rows in a random order, rows permuted within windows of
  #                      shuffle_buffer examples (sfjax/data/block_shuffle; several times faster)
  d.shuffle_block_rows = 2048  # data.shuffle=block: consecutive examples read as one block
  d.shuffle_threads = 1  # data.shuffle=block: 2 = the next window copied and permuted on a
  #                       second thread (uses a second core, which XLA's step would otherwise get)
  d.use_features = ""  # comma-separated feature names to train on ('' = all; ablations)
  d.pooling = ""  # bags' poolings overridden, e.g. "tags:mean,long0:sqrtn" (a search's choice)
  d.tables = ""  # a feature layout's tables' own settings, e.g. "item:dim=8,optimizer=adagrad,
  #               learning_rate=0.05; user:dim=4" (keys optimizer, learning_rate, init_stddev,
  #               dim: the model reads the first dim latent columns of the table's rows)
  d.synthetic = s = ml_collections.ConfigDict()
  s.num_train = 2_000_000  # rows, repeated as epochs
  s.num_eval = 200_000
  s.test_rows = 0  # > 0: a 'test' split of this many rows beside 'eval' (reported, never selected on)
  s.cardinality_scale = 0.001  # multiplies the real Criteo per-field cardinalities
  s.min_rows = 4  # per field, after scaling
  s.zipf_exponent = 1.1
  s.planted_dim = 8
  s.num_dense = 13
  d.multihot = mh = ml_collections.ConfigDict()  # format multihot (sfjax/data/generated/multihot.py)
  mh.num_train = 2_000_000  # rows, repeated as epochs (2000 steps x 1024: one pass, no memorising)
  mh.num_eval = 20_000
  mh.test_rows = 0  # > 0: a 'test' split of this many rows beside 'eval'
  mh.user_rows = 10_000  # one-hot user table
  mh.item_rows = 20_000  # item table: the target item and the history sequence share it
  mh.num_context = 2  # one-hot context fields ctx0.. (site, device, ...)
  mh.context_rows = 100  # rows of each context table
  mh.num_short_bags = 4  # short multi-hot bags bag0.. (bag0 weighted)
  mh.short_bag_capacity = 3  # ids per short bag at most
  mh.short_bag_rows = 1000  # rows of each short bag's table
  mh.short_bag_mean_len = 1.6  # short bag length min(Geometric(1 / this), capacity)
  mh.num_long_bags = 2  # long bags long0.. (DLRMv2-like: 100+ ids possible)
  mh.long_bag_capacity = 128  # ids per long bag at most
  mh.long_bag_rows = 5000  # rows of each long bag's table
  mh.long_bag_median_len = 30.0  # long bag length clip(round(LogNormal(log median, sigma)), 1, cap)
  mh.long_bag_sigma = 0.8
  mh.history_capacity = 20  # sequence 'history' over the item table; length uniform in [1, cap]
  mh.zipf_exponent = 1.1  # id popularity in every table
  mh.planted_dim = 8  # K of the planted vectors
  mh.num_dense = 4  # N(0, 1) dense features
  mh.shares = (0.3, 0.25, 0.35, 0.1)  # logit variance shares: first order, bags, history, dense
  mh.logit_scale = 2.0  # logit std when the shares sum to 1
  mh.target_ctr = 0.25  # mean click probability
  d.parquet = pq = ml_collections.ConfigDict()  # format parquet (sfjax/data/parquet/columns.py)
  pq.label = "label"  # label column: int, float or bool, values 0 or 1
  pq.dense = ""  # dense columns, comma separated (floats taken as given)
  pq.dense_transform = "none"  # none | log1p (sign(x) * log(1 + |x|), as the criteo reader)
  pq.categorical = ""  # scalar int/string columns, comma separated; '' = every other column
  pq.bags = ""  # list columns 'name:kind:capacity[:pooling][:weight column]', comma separated,
  #               kind multi_hot|sequence, e.g. 'genres:multi_hot:8:mean,history:sequence:20'
  pq.shared_tables = ""  # 'feature=owner,...': feature reads owner's table (history=item_id)
  d.movielens = m = ml_collections.ConfigDict()
  m.path = ""  # folder with ml-100k.{inter,user,item}; '' = the copy inside the recbole wheel
  m.split_seed = 2024
  m.genres = "first"  # first: the movie's first genre, one-hot | all: every genre, a mean-pooled
  #                    multi_hot bag (issue #22)
  m.history = 0  # N > 0: a 'history' sequence of the user's N most recent ratings with an
  #               earlier timestamp (ties excluded), sharing item_id's table; 0 = none
  m.label_history = 0  # N > 0: 'liked_history'/'disliked_history' sequences of the user's N most
  #                     recent earlier TRAIN-split ratings with label 1/0 (reads train labels)

  # ---- model ------------------------------------------------------------
  c.model = mo = ml_collections.ConfigDict()
  mo.name = "deepfm"  # lr | fm | deepfm | wide_deep | dcnv2 | dlrm | autoint | xdeepfm | composed
  #                    | din (needs a data set with a sequence feature: format multihot, ...)
  mo.embed_dim = 16
  mo.mlp_dims = (400, 400, 400)
  mo.split_input = True  # deepfm: gather vectors and weights as separate blocks, MLP's first
  #                       layer split per block (no concatenated input): 4-9% less step time
  #                       on CPU; False: one [B, F*D+Nd] input, equal up to float rounding
  #                       (issue #27; DeepFM.from_unique_rows). Search cohorts use False.
  mo.cross_layers = 3  # dcnv2
  mo.cross_rank = 0  # dcnv2: 0 = full-rank cross matrices
  mo.cross_structure = "stacked"  # dcnv2: stacked (cross then MLP) | parallel
  mo.bottom_mlp_dims = (64, 16)  # dlrm
  mo.attention_layers = 2  # autoint
  mo.attention_heads = 2  # autoint
  mo.attention_dim = 16  # autoint (per head)
  mo.cin_dims = (64, 64)  # xdeepfm
  mo.din_attention_dims = (80, 40)  # din: hidden widths of the activation unit (PReLU), as
  #                                   in the paper's and DeepCTR's DIN; mlp_dims is its top MLP
  mo.din_pooling = "sum"  # din: sum (the paper's: sum_i a_i h_i) | mean (divided by the real
  #                          history items' count: its scale does not grow with the length)
  #                          | softmax (the weights normalised over the real items)
  mo.blocks = ""  # composed: block spec JSON (sfjax/models/generator.py); embed_dim = its row width

  # ---- embeddings (rows updated by a row-wise optimizer) ----------------
  c.embedding = e = ml_collections.ConfigDict()
  e.backend = "device"  # device: whole table on the accelerator (the reference) | cache: MixCache
  e.sharding = "replicated"  # device backend: replicated (every device holds the whole table) |
  #                           row (device d holds rows r % D == d: D x the rows of one device)
  e.placement = ""  # '' = embedding.backend / sharding as set | auto (the planner's choice for
  #                  the run, from its largest table; sfjax/embedding/placement.py) | replicated |
  #                  row (device backend) | cache
  e.plan = p = ml_collections.ConfigDict()  # the placement planner's budgets (placement=auto)
  p.device_bytes = 0.0  # table bytes (rows + slots) per device; 0 = the device's memory limit
  p.host_bytes = 0.0  # host-table bytes per host (process); 0 = the host's physical memory
  p.replicate_fraction = 0.25  # tables replicated while together <= this part of device_bytes
  p.unique_fraction = 1.0  # expected unique ids / ids of a step, for the plan's exchange bytes
  e.cache_rows = 0.0  # cache backend: device cache rows (>= 1), a fraction of the table (< 1), or
  #                    0 = auto: 5% of the table, raised to the minimum lookahead x unique capacity
  e.cache_policy = "lru"  # cache backend: lru | lfu
  e.lookahead = 2  # cache backend: steps planned ahead of the device (in flight at once)
  e.keep_upcoming = -1  # cache backend: the next batches whose cached rows are kept from
  #                      eviction while others can go (their ids are read before planning);
  #                      -1 = lookahead - 1: no step waits for a write-back; 0 = the policy alone
  e.cache_sharding = "replicated"  # cache backend: replicated (every device holds the same
  #                                 cache_rows rows) | row (device d owns its own cache_rows rows:
  #                                 cache_rows x devices distinct rows in all)
  e.host_storage = "ram"  # cache backend: ram | mmap (memory-mapped files under host_path)
  e.host_path = ""  # cache backend with mmap: directory of the host table (created; must be new)
  e.optimizer = "adagrad"  # sgd | adagrad | rowwise_adagrad (1 slot per row) | adam | ftrl
  e.learning_rate = 0.05
  e.init_stddev = 0.01
  e.l2 = 0.0  # L2 penalty on the rows a batch touches (added to the loss)
  e.adagrad_initial_accumulator = 1e-6  # adagrad and rowwise_adagrad
  e.adam_b1 = 0.9
  e.adam_b2 = 0.999
  e.adam_eps = 1e-8
  e.ftrl_l1 = 0.0
  e.ftrl_l2 = 0.0
  e.ftrl_beta = 0.0
  e.ftrl_initial_accumulator = 0.1
  e.unique_capacity = 0  # padded unique rows per step; 0 = batch_size * num_fields
  e.dtype = "float32"  # table rows on device, in the cache and host table: float32 | bfloat16 |
  #                     float16 (half the bytes; slots stay float32; sfjax/embedding/row_dtype.py)
  e.stochastic_rounding = False  # half-width rows: round updates stochastically (keyed by step)

  # ---- dense parameters (optax) -----------------------------------------
  c.optimizer = o = ml_collections.ConfigDict()
  o.name = "adam"  # adam | adamw | sgd | adagrad
  o.learning_rate = 1e-3
  o.weight_decay = 0.0

  # ---- loop -------------------------------------------------------------
  c.train = t = ml_collections.ConfigDict()
  t.steps = 2000
  t.batch_size = 1024
  t.eval_every = 500  # steps; the last step always evaluates
  t.eval_batch_size = 8192
  t.log_every = 100
  t.prefetch = 4  # host batches prepared ahead of the device step
  t.loader_nice = 10  # niceness (0-19, Linux) of the host threads that prepare batches (device
  #                    backend: the loader; cache: loader, manager, write-back), so they yield
  #                    the cores to XLA's step threads (issue #27); 0 = unchanged
  t.loader_idle = False  # True: those threads run under SCHED_IDLE (Linux) instead, taking a
  #                       core only when XLA's threads leave one free: on a quiet 2-core Xeon
  #                       the cache backend ran 0.6-6% faster end to end (4 paired runs,
  #                       issue #27), but beside busy processes they all but stop (a 14 s
  #                       smoke run took > 100 s beside two busy loops): off by default
  t.host_allocator = "tuned"  # tuned: glibc malloc keeps XLA:CPU's per-step buffers warm instead
  #                            of mapping and faulting them in every step (25% faster steps on a
  #                            2-core Xeon; sfjax/core/host_allocator.py) | system: the defaults
  t.xla_cpu_dots = "auto"  # the library of the train steps' dots on CPU: auto (eigen on AMD CPUs,
  #                         else xla) | eigen (12% faster steps on a 2-core AMD EPYC) | xla
  #                         (XLA's default: YNNPACK); float rounding only (sfjax/core/xla_cpu_dots.py)
  t.num_devices = 0  # data-parallel devices of the ('data',) mesh; 0 = all local devices

  # ---- many processes / hosts (jax.distributed; sfjax/parallel/distributed.py) ----
  c.distributed = dd = ml_collections.ConfigDict()
  dd.coordinator = ""  # HOST:PORT of process 0 ('' = one process, or JAX_COORDINATOR_ADDRESS)
  dd.num_processes = 0  # P, with a coordinator (or JAX_NUM_PROCESSES)
  dd.process_id = -1  # this process, 0..P-1, with a coordinator (or JAX_PROCESS_ID)
  dd.auto_detect = False  # True: JAX's cluster detection (SLURM / Open MPI / k8s / Cloud TPU)
  dd.timeout_s = 300.0  # bound of every cross-process wait: start-up, barriers, a dead peer
  dd.bind_address = ""  # HOST:PORT process 0's coordinator binds ('' = the coordinator's own)

  # ---- checkpoints (WORKDIR/checkpoints/step_N; sfjax/checkpoint/checkpointer.py) ----
  c.checkpoint = k = ml_collections.ConfigDict()
  k.every_steps = 0  # save every this many steps and at the last step; 0 = off. When > 0, a
  #                    rerun with the same workdir resumes from the latest checkpoint
  k.keep = 3  # newest checkpoints kept (older ones are deleted after a save succeeds)

  # ---- resuming (sfjax/train/resume_check.py) ----------------------------
  c.resume = "strict"  # strict: a checkpoint of other settings (seed, data, learning rates,
  #                      ...) is refused | allow_changes: resumed, the change recorded in
  #                      WORKDIR/config_history.jsonl. Shape changes are always refused.

  return c

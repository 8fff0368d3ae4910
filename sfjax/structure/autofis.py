"""AutoFIS: automatic feature-interaction selection in factorization models.

Liu et al., KDD 2020. Stage 1 (search): every field pair (i, j) gets a gate
α_ij on its batch-normalised inner product,

  logit = b + Σ_f w_f + d·dense + Σ_{i<j} α_ij BN(<e_i, e_j>) [+ MLP(e, dense)],

the registered model `gated_fm` (`sfjax.models.gated_fm`), trained through the
shared train step (`gate_training`): dense network weights by Adam and the gates
by gRDA (`sfjax.train.grda`, the dense optimizer 'grda'), one
`optax.multi_transform`; the embedding rows by the trainer's row optimizers
(Adagrad by default: row-wise Adam overfitted the rare ids here). gRDA sets most
gates exactly to zero. BN has no learnable scale or shift (the paper's point: the
scale of <e_i, e_j> must not stand in for α), uses batch moments in training and
running moments in evaluation. Stage 2 (retrain): a fresh model with the surviving
pairs only, the gates fixed at 1 (no BN: a plain FM over those pairs). Without
`mlp_dims` the model is AutoFIS's FM variant, with it the DeepFM variant.

One departure from the paper: the search starts with `warmup_steps` steps with
every gate at 0. Without it, on the planted data a pair with a few-valued field
(4 ids) absorbed part of a strong first-order effect faster than the first-order
weights learned it, and gRDA then kept that spurious pair.

Data: the task's `TrialData`; both stages train on the same precomputed batches.
The kept pairs are the nonzero gates of stage 1, nothing else is selected; the
reported metrics are the retrained model's on the valid (first) and test
(second) halves of the eval rows (`gate_training.split_metrics`).

`planted_pairs` gives the ground truth on synthetic data (the pairs carrying most
of the planted FM's pairwise logit variance), `pair_precision_recall` scores a
selection against it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.data.generated import planted as planted_lib
from sfjax.data.generated import synthetic
from sfjax.models.gated_fm import GatedFM, all_field_pairs, check_pairs
from sfjax.structure import gate_training as st
from sfjax.train import optimizers


@dataclasses.dataclass(frozen=True)
class AutoFISSettings:
  """AutoFIS settings.

  Attributes:
    embed_dim: E, embedding dimension (the table holds E + 1 columns: the last is
      the first-order weight).
    mlp_dims: MLP tower widths; () = the FM variant (AutoFM).
    search_steps: stage-1 steps (gates trained after the warm-up).
    warmup_steps: the first stage-1 steps, which train the network with every gate
      at 0: first-order weights fitted first, so a pair with a nearly constant field
      cannot take over a first-order effect (which the gates then keep).
    retrain_steps: stage-2 steps on the kept pairs.
    batch_size: examples per step (0 = the task's).
    eval_rows: eval examples, split into valid and test halves (0 = the task's).
    dense_lr: Adam learning rate of the dense network weights.
    embedding_lr: learning rate of the embedding rows.
    embedding_optimizer: row optimizer of the embeddings (`ROW_OPTIMIZER_NAMES`).
    grda_lr: gRDA learning rate γ of the gates.
    grda_c: gRDA threshold scale c.
    grda_mu: gRDA threshold growth μ.
    gate_init: initial value of every gate.
    bn_momentum: running-moment decay of the batch norm (evaluation moments).
    init_stddev: standard deviation of the initial embedding rows.
    seed: parameter seed (the data seed is the task's).
  """

  embed_dim: int = 8
  mlp_dims: tuple = ()
  search_steps: int = 1500
  warmup_steps: int = 300
  retrain_steps: int = 1500
  batch_size: int = 0
  eval_rows: int = 0
  dense_lr: float = 3e-3
  embedding_lr: float = 0.05
  embedding_optimizer: str = "adagrad"
  grda_lr: float = 1.0
  grda_c: float = 0.005
  grda_mu: float = 0.8
  gate_init: float = 0.1
  bn_momentum: float = 0.99
  init_stddev: float = 0.05
  seed: int = 0

  def __post_init__(self):
    st.check_structure_settings(
        self, ints={"search_steps": 1, "retrain_steps": 0, "warmup_steps": 0},
        floats={"grda_lr": (0.0, False), "grda_c": (0.0, True), "grda_mu": (0.0, True),
                "gate_init": (-math.inf, True), "bn_momentum": (0.0, True, 1.0)})
    if self.warmup_steps >= self.search_steps:
      raise ValueError(f"AutoFISSettings.warmup_steps must be < search_steps={self.search_steps} "
                       f"(the gates train after the warm-up), got {self.warmup_steps}")


@dataclasses.dataclass(frozen=True)
class AutoFISResult:
  """What an AutoFIS run found.

  Attributes:
    kept_pairs: the surviving pairs (i, j), i < j, field indices, in `all_pairs` order.
    gates: [P] float final gate values of the search (0 = pruned), `all_pairs` order.
    all_pairs: every pair (i, j), i < j (P = F (F - 1) / 2).
    field_names: the F field names.
    valid_auc, valid_logloss: the retrained model on the valid half of the eval rows.
    test_auc, test_logloss: the retrained model on the test half (never used to select).
    search_auc, search_logloss: the search model (gates on) on the valid half.
    steps: search steps + retrain steps.
    wall_s: seconds of the whole run.
  """

  kept_pairs: tuple
  gates: np.ndarray
  all_pairs: tuple
  field_names: tuple
  valid_auc: float
  valid_logloss: float
  test_auc: float
  test_logloss: float
  search_auc: float
  search_logloss: float
  steps: int
  wall_s: float

  def to_json(self) -> dict:
    """A JSON-serialisable dict (lists for tuples and arrays); `from_json` inverts it."""
    out = dataclasses.asdict(self)
    out["kept_pairs"] = [list(p) for p in self.kept_pairs]
    out["all_pairs"] = [list(p) for p in self.all_pairs]
    out["field_names"] = list(self.field_names)
    out["gates"] = [float(g) for g in np.asarray(self.gates)]
    return out

  @classmethod
  def from_json(cls, record: dict) -> AutoFISResult:
    """The result written by `to_json`."""
    fields = {f.name for f in dataclasses.fields(cls)}
    missing = sorted(fields - set(record))
    if missing:
      raise ValueError(f"AutoFIS result record lacks {missing}")
    values = {k: record[k] for k in fields}
    values["kept_pairs"] = tuple(tuple(int(x) for x in p) for p in record["kept_pairs"])
    values["all_pairs"] = tuple(tuple(int(x) for x in p) for p in record["all_pairs"])
    values["field_names"] = tuple(record["field_names"])
    values["gates"] = np.asarray(record["gates"], np.float32)
    return cls(**values)


def _optimizer(settings: AutoFISSettings, train_gates: bool) -> optax.GradientTransformation:
  """Adam on the network; gRDA on the gates (`train_gates`), else the gates stay."""
  gates = (optimizers.dense_optimizer("grda", settings.grda_lr, c=settings.grda_c,
                                      mu=settings.grda_mu) if train_gates else None)
  return st.group_optimizer({"net": optimizers.dense_optimizer("adam", settings.dense_lr),
                             "gates": gates}, default="net")


@functools.lru_cache(maxsize=32)
def _runner(graphdef: nnx.GraphDef, settings: AutoFISSettings, train_gates: bool,
            compiler_options: tuple[tuple[str, str], ...] = ()):
  """The jitted runner (compiled with the task's `compiler_options`); cached so runs that
  differ only by seed or step counts share it (`settings` arrives with those fields zeroed)."""
  return st.make_runner(graphdef, _optimizer(settings, train_gates), st.row_optimizer(settings),
                        compiler_options)


def _train_model(data: TrialData, settings: AutoFISSettings, pairs: tuple, gate_value: float,
                 search: bool, steps: int, seed_offset: int):
  """Trains one AutoFIS model (`gated_fm`); returns (state, graphdef).

  In a search the first `warmup_steps` steps train the network with every gate at 0
  (no pair term), then the gates start at `gate_value` and gRDA trains them with the
  network (whose Adam state carries on). Outside a search the gates stay at `gate_value`.
  """
  seed = settings.seed * 7919 + seed_offset
  warmup = min(settings.warmup_steps, steps) if search else 0
  model = st.with_layout(GatedFM(  # the registry's "gated_fm", over the pooled fields
      num_fields=data.spec.num_fields, embed_dim=settings.embed_dim,
      num_dense=data.spec.num_dense, rngs=nnx.Rngs(seed), mlp_dims=settings.mlp_dims,
      pairs=pairs, pair_norm=search, bn_momentum=settings.bn_momentum,
      gate_init=0.0 if warmup else gate_value), data.spec)
  graphdef = nnx.graphdef(model)
  key = dataclasses.replace(settings, seed=0, search_steps=1, retrain_steps=0, warmup_steps=0,
                            batch_size=0, eval_rows=0, gate_init=0.0)
  state = st.init_state(model, _optimizer(settings, search and not warmup), st.row_optimizer(settings),
                        data.num_rows, seed=seed, init_stddev=settings.init_stddev)
  if warmup:
    state, _ = st.train(state, data, _runner(graphdef, key, False, data.task.compiler_options), 0,
                        warmup)
    model = nnx.merge(graphdef, state.params)
    gates = st.unwrap(model).gates
    gates[...] = jnp.full(gates.shape, gate_value, jnp.float32)
    search_tx = _optimizer(settings, True)
    opt_state = st.keep_group_states(search_tx.init(nnx.state(model, nnx.Param)), state.opt_state,
                                     ("net",))
    state = state._replace(params=nnx.state(model), opt_state=opt_state)
  state, _ = st.train(state, data, _runner(graphdef, key, search, data.task.compiler_options),
                      warmup, steps)
  return state, graphdef


def _metrics(data: TrialData, state, graphdef) -> dict[str, float]:
  return st.split_metrics(data, st.host_eval_logits(st.eval_graphdef(graphdef, state.params), state,
                                               data))


def retrain_with_pairs(data: TrialData, settings: AutoFISSettings, pairs: Sequence[tuple[int, int]]
                       ) -> dict[str, float]:
  """Stage 2: a fresh model with the gates fixed to 1 on `pairs` (no BN), its split metrics.

  Args:
    data: the task's TrialData (as `run_autofis` builds it).
    settings: AutoFIS settings (retrain_steps, learning rates, sizes, seed).
    pairs: the interacting pairs (i, j), i < j.

  Returns:
    {'valid_auc', 'valid_logloss', 'test_auc', 'test_logloss'}.
  """
  pairs = check_pairs(pairs, data.spec.num_fields, key="pairs")
  state, graphdef = _train_model(data, settings, pairs, 1.0, search=False,
                                 steps=settings.retrain_steps, seed_offset=2)
  return _metrics(data, state, graphdef)


def _search_gates(data: TrialData, settings: AutoFISSettings) -> tuple[np.ndarray, dict[str, float]]:
  """Stage 1: trains every pair's gate with gRDA.

  Returns:
    ([P] final gates in `all_field_pairs` order, the search model's split metrics).
  """
  state, graphdef = _train_model(data, settings, all_field_pairs(data.spec.num_fields),
                                 settings.gate_init, search=True, steps=settings.search_steps,
                                 seed_offset=1)
  gates = st.unwrap(nnx.merge(graphdef, state.params)).gates
  return np.asarray(gates[...]), _metrics(data, state, graphdef)


def run_autofis(task: CTRTask, settings: AutoFISSettings, data: TrialData | None = None) -> AutoFISResult:
  """Searches the gates, keeps the nonzero ones, retrains on them.

  Args:
    task: the CTR task (its data block, seed, batch size and eval rows unless
      `settings` overrides them).
    settings: AutoFIS settings.
    data: the task's TrialData if already built (must match `settings` overrides).

  Returns:
    AutoFISResult.
  """
  t0 = time.perf_counter()
  data = data if data is not None else st.prepare_trial_data(task, settings)
  all_pairs = all_field_pairs(data.spec.num_fields)
  gates, search_metrics = _search_gates(data, settings)
  kept = tuple(p for p, g in zip(all_pairs, gates, strict=True) if g != 0.0)
  metrics = retrain_with_pairs(data, settings, kept)
  return AutoFISResult(
      kept_pairs=kept, gates=gates, all_pairs=all_pairs,
      field_names=tuple(f.name for f in data.spec.fields), **metrics,
      search_auc=search_metrics["valid_auc"], search_logloss=search_metrics["valid_logloss"],
      steps=settings.search_steps + settings.retrain_steps, wall_s=time.perf_counter() - t0)


def planted_pairs(data_cfg, seed: int, share: float = 0.5, num_rows: int = 32768) -> tuple[tuple[int, int], ...]:
  """The planted FM's dominant pairs: the fewest pairs holding >= `share` of its pairwise variance.

  Each pair's variance is that of its term <v_i[id_i], v_j[id_j]> of the planted
  logit over `num_rows` rows of the train split (`planted.pair_logit_variance`);
  pairs are taken by decreasing variance until their sum reaches `share` of the
  total over all pairs.

  Args:
    data_cfg: the `data` config block (format 'synthetic').
    seed: the data seed (the task's).
    share: fraction of the summed pair variance in (0, 1].
    num_rows: rows the variances are measured on.

  Returns:
    The pairs (i, j), i < j, sorted.
  """
  if getattr(data_cfg, "format", None) != "synthetic":
    raise ValueError(f"planted_pairs needs data.format='synthetic', got {getattr(data_cfg, 'format', None)!r}")
  st.check_float("planted_pairs", "share", share, 0.0, False, high=1.0)
  variance = _planted_variance(synthetic.SyntheticConfig.from_any(data_cfg.synthetic), seed, num_rows)
  i, j = np.triu_indices(variance.shape[0], 1)
  values = variance[i, j]
  order = np.argsort(-values, kind="stable")
  cumulative = np.cumsum(values[order])
  count = int(np.searchsorted(cumulative, share * cumulative[-1] * (1 - 1e-12)) + 1)
  return tuple(sorted((int(i[k]), int(j[k])) for k in order[:count]))


@functools.lru_cache(maxsize=16)
def _planted_variance(config: synthetic.SyntheticConfig, seed: int, num_rows: int) -> np.ndarray:
  """[F, F] planted pair variances (cached: building the planted model calibrates it)."""
  dataset = synthetic.SyntheticCTR(config, seed)
  variance = planted_lib.pair_logit_variance(dataset.planted, dataset.generate_rows("train", 0, num_rows).ids)
  variance.setflags(write=False)
  return variance


def pair_precision_recall(kept: Sequence[tuple[int, int]], truth: Sequence[tuple[int, int]]
                          ) -> tuple[float, float]:
  """(precision, recall) of the kept pairs against the true ones (order within a pair ignored).

  Precision of an empty selection is 1 by convention (no false pair); recall of an
  empty truth is 1.
  """
  def norm(pairs):
    return {tuple(sorted((int(a), int(b)))) for a, b in pairs}

  kept_set, truth_set = norm(kept), norm(truth)
  hits = len(kept_set & truth_set)
  precision = hits / len(kept_set) if kept_set else 1.0
  recall = hits / len(truth_set) if truth_set else 1.0
  return precision, recall

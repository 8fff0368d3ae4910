"""Training the structure-search models (AutoFIS, AutoGroup) through the one train step.

The models are registered NNX models (`sfjax.models.gated_fm`,
`sfjax.models.group_interactions`) whose forward updates variables besides their
parameters (batch-norm moments, a Gumbel stream), so they train through
`sfjax.train.step.make_train_step(..., model_variables=True)`: the embedding rows
by a row optimizer on the batch's `[U, E]` unique rows only, the dense parameters
by one optax transformation that `optax.multi_transform` splits into parameter
groups (`group_optimizer`: AutoFIS's network by Adam and gates by gRDA, AutoGroup's
network and structure logits by Adam each); a group labelled `_FROZEN` does not
move. The state is the trainer's `TrainState` (`params` = the model's whole
`nnx.State`), the batches are a `TrialData`'s precomputed `DeviceBatch`es, run as
one jitted `lax.scan` per window of steps (`make_runner`, `train`).

Evaluation is `step.eval_logits` of the model's evaluation graph (`model.eval()`:
running BN moments, argmax memberships), over the task's eval rows split like
`cohort_call.split_eval_mask`: the first half is 'valid' (any selection uses it),
the second half 'test' (only reported).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

from sfjax.cohorts import program as program_lib
from sfjax.cohorts.cohort_call import split_eval_mask
from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.core import metrics as metrics_lib
from sfjax.embedding import device_table, row_optimizers
from sfjax.models.behavior.pooling import PooledInput
from sfjax.train import defaults as defaults_lib
from sfjax.train import step as step_lib
from sfjax.train.state import TrainState

_FROZEN = "frozen"  # the label of parameters no optimizer moves (`group_optimizer`)


def check_int(owner: str, name: str, value: Any, low: int) -> None:
  """Raises ValueError naming `owner.name` unless `value` is an integer >= low."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f"{owner}.{name} must be an integer >= {low}, got {value!r}")


def check_float(owner: str, name: str, value: Any, low: float, low_ok: bool,
                high: float = math.inf) -> None:
  """Raises ValueError naming `owner.name` unless `value` is a finite number in range."""
  ok = (isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
        and math.isfinite(value))
  if not ok or value < low or (value == low and not low_ok) or value > high:
    bound = f"{'>=' if low_ok else '>'} {low}" + (f" and <= {high}" if high < math.inf else "")
    raise ValueError(f"{owner}.{name} must be a finite number {bound}, got {value!r}")


def check_structure_settings(settings, ints: Mapping[str, int],
                   floats: Mapping[str, tuple[float, bool] | tuple[float, bool, float]],
                   tuples: tuple[str, ...] = ("mlp_dims",)) -> None:
  """Checks a frozen AutoFIS / AutoGroup settings dataclass; errors name `<Class>.<field>`.

  The `tuples` fields given as lists (a JSON round trip) become tuples first; then the
  fields both settings share (embed_dim, mlp_dims, batch_size, eval_rows, seed, the
  learning rates, init_stddev, embedding_optimizer), then each of `ints` (field ->
  lowest value) and `floats` (field -> (low, whether low is allowed[, high])).

  Raises:
    ValueError: naming the first bad field.
  """
  for name in tuples:
    if isinstance(getattr(settings, name), list):
      object.__setattr__(settings, name, tuple(getattr(settings, name)))
  owner = type(settings).__name__
  check_int(owner, "embed_dim", settings.embed_dim, 1)
  if not isinstance(settings.mlp_dims, tuple):
    raise ValueError(f"{owner}.mlp_dims must be a tuple of widths, got {settings.mlp_dims!r}")
  for width in settings.mlp_dims:
    check_int(owner, "mlp_dims", width, 1)
  for name in ("batch_size", "eval_rows"):
    check_int(owner, name, getattr(settings, name), 0)
  check_int(owner, "seed", settings.seed, 0)
  for name in ("dense_lr", "embedding_lr", "init_stddev"):
    check_float(owner, name, getattr(settings, name), 0.0, False)
  row_optimizers.make(settings.embedding_optimizer, settings.embedding_lr,
                      defaults_lib.ctr_defaults().embedding, field=f"{owner}.embedding_optimizer")
  for name, low in ints.items():
    check_int(owner, name, getattr(settings, name), low)
  for name, bounds in floats.items():
    check_float(owner, name, getattr(settings, name), *bounds)


def prepare_trial_data(task: CTRTask, settings) -> TrialData:
  """The TrialData of `task` with `settings.batch_size` / `settings.eval_rows` when nonzero."""
  overrides = {k: getattr(settings, k) for k in ("batch_size", "eval_rows") if getattr(settings, k)}
  return TrialData(dataclasses.replace(task, **overrides) if overrides else task)


def with_layout(model: nnx.Module, spec) -> nnx.Module:
  """`model` behind the data set's feature layout (`PooledInput`: bags and sequences pool
  into the F fields the structure model reads, issue #22); `model` itself without one."""
  return model if spec.layout is None else PooledInput(model, spec.layout)


def unwrap(model: nnx.Module) -> Any:
  """The structure model itself: the inner model of a `with_layout` wrapper."""
  return model.inner if isinstance(model, PooledInput) else model


def row_optimizer(settings) -> row_optimizers.RowOptimizer:
  """The row optimizer `settings.embedding_optimizer` at `settings.embedding_lr`."""
  return row_optimizers.make(settings.embedding_optimizer, settings.embedding_lr,
                             defaults_lib.ctr_defaults().embedding)


def group_optimizer(groups: Mapping[str, optax.GradientTransformation | None],
                    default: str) -> optax.GradientTransformation:
  """One optax transformation over a model's parameter groups (`optax.multi_transform`).

  A parameter's group is its top-level attribute name when `groups` has it, else
  `default`; behind a feature layout's `PooledInput` (`with_layout`) the top level is
  the inner model's (`['inner']['gates']` is in group 'gates'). A group mapped to None
  is `_FROZEN`: its updates are 0.

  Args:
    groups: group name -> transformation (or None).
    default: the group of every other top-level attribute.
  """
  if default not in groups:
    raise ValueError(f"group_optimizer: default group {default!r} is not one of {sorted(groups)}")
  transforms = {name: optax.set_to_zero() if tx is None else tx for name, tx in groups.items()}

  def name(entry):
    return getattr(entry, "key", getattr(entry, "name", None))

  def label(path, _):
    top = name(path[1]) if name(path[0]) == "inner" and len(path) > 1 else name(path[0])
    return top if top in transforms else default

  def labels(params):
    return jax.tree_util.tree_map_with_path(label, params)

  return optax.multi_transform(transforms, labels)


def keep_group_states(new_state: optax.MultiTransformState, old_state: optax.MultiTransformState,
                      groups: tuple[str, ...]) -> optax.MultiTransformState:
  """`new_state` (a `group_optimizer` state) with the states of `groups` taken from `old_state`.

  For a switch of one group's optimizer mid-run (AutoFIS's gates after the
  warm-up), the other groups continuing where they were.
  """
  return optax.MultiTransformState({**new_state.inner_states,
                                    **{g: old_state.inner_states[g] for g in groups}})


def init_state(model: nnx.Module, tx: optax.GradientTransformation,
               row_opt: row_optimizers.RowOptimizer, num_rows: int, *, seed: int,
               init_stddev: float) -> TrainState:
  """A fresh `TrainState` of `model`: params a copy of its whole state, `tx` over its Params.

  The table is `device_table.init_table` (counter-based rows of `seed`) with the
  model's row width (the inner model's, behind a `with_layout` wrapper). The copy
  leaves `model` usable after the runner donates the state.
  """
  inner = unwrap(model)
  width = inner.embedding_width(inner.embed_dim)
  table = device_table.init_table(num_rows, width, row_opt, seed=seed, stddev=init_stddev)
  params = jax.tree.map(jnp.copy, nnx.state(model))
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(nnx.state(params, nnx.Param)),
                    table)


def make_runner(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                row_opt: row_optimizers.RowOptimizer,
                compiler_options: tuple[tuple[str, str], ...] = ()):
  """Jitted `run(state, batches [T]) -> (state, losses [T])`: a `lax.scan` of the shared step,
  compiled with XLA's `compiler_options` ((name, value) pairs: the task's
  `CTRTask.compiler_options`, its `xla_cpu_dots`).

  The state is donated. The model's own variables (BN moments, the Gumbel counter)
  travel in the state, so a run split into windows equals one long run.
  """
  step = step_lib.make_train_step(graphdef, tx, row_opt, model_variables=True)

  def run(state, batches):
    def body(state, batch):
      state, metrics = step(state, batch)
      return state, metrics["loss"]

    return lax.scan(body, state, batches)

  return jax.jit(run, donate_argnums=0, compiler_options=dict(compiler_options))


def train(state: TrainState, data: TrialData, runner, start: int, end: int,
          window: int = 256) -> tuple[TrainState, np.ndarray]:
  """Runs steps `[start, end)` of `data` in windows of at most `window` steps.

  Returns:
    The state and the [end - start] per-step losses (host).
  """
  losses = []
  for lo in range(start, end, window):
    hi = min(end, lo + window)
    state, loss = runner(state, data.train_steps(lo, hi))
    losses.append(np.asarray(loss))
  return state, (np.concatenate(losses) if losses else np.zeros(0, np.float32))


def eval_graphdef(graphdef: nnx.GraphDef, params) -> nnx.GraphDef:
  """The graph of the model in evaluation mode (`model.eval()`), for the same state."""
  model = nnx.merge(graphdef, params)
  model.eval()
  return nnx.graphdef(model)


_eval_logits = jax.jit(program_lib.stacked_eval_logits, static_argnums=0)


def host_eval_logits(graphdef: nnx.GraphDef, state: TrainState, data: TrialData) -> np.ndarray:
  """[Te * Be] host logits of the task's stacked eval set (`graphdef`: an eval graph)."""
  return np.asarray(_eval_logits(graphdef, state, data.eval_batches)).reshape(-1)


def split_metrics(data: TrialData, logits: np.ndarray) -> dict[str, float]:
  """Exact AUC / logloss on the valid (first) and test (second) halves of the eval rows.

  Returns:
    {'valid_auc', 'valid_logloss', 'test_auc', 'test_logloss'}.
  """
  valid, test = split_eval_mask(data.eval_mask)
  probs = metrics_lib.sigmoid(logits)
  out = {}
  for name, mask in (("valid", valid), ("test", test)):
    out[f"{name}_auc"] = metrics_lib.auc(data.eval_labels, logits, mask)
    out[f"{name}_logloss"] = metrics_lib.logloss(data.eval_labels, probs, mask)
  return out

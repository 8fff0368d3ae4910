"""One call of a cohort program: W stacked trials over a step range, host metrics after.

DESIGN.md §4. `call_cohort` runs W trials as one `jax.jit` of `jax.vmap(trial)`
(`sfjax.cohorts.program`): init (or resume), a `lax.scan` of the train step over
the task's precomputed batches, and eval over the whole stacked eval set; AUC and
logloss are computed exactly on the host, on the two halves of the eval rows
(`split_eval_mask`).

  * Compiled programs are cached per process by (arch, data set spec, resume,
    masked, rows, ragged, compiler options) (`cohort_program`), so runners of one task
    share them; they are compiled with the task's `CTRTask.compiler_options`
    (`xla_cpu_dots`);
    `_num_traces` counts their traces (no-recompile checks).
  * The trial axis is sharded over a ('trial',) mesh (`trial_mesh`) when W is a
    multiple of the mesh size; batches are replicated.
  * Host input states are copied before the call: the program donates them.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import lane_optimizers
from sfjax.cohorts import program as trial_program
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.table_choices import table_dims
from sfjax.cohorts.task import TrialData
from sfjax.core import metrics as metrics_lib


class CohortOutput(NamedTuple):
  """One program call over W trials (device states, host metrics).

  Attributes:
    states: stacked [W] TrainState, on device.
    alive: [W] bool; steps: [W] int, global steps applied.
    losses: [W, L] per-step train loss; applied: [W, L] bool.
    auc, logloss: [W] float64 exact metrics on the first half of the eval rows (the
      'valid' half that searches select on; NaN for failed trials).
    test_auc, test_logloss: [W] the same on the second half, never used for selection.
    seconds: wall time of the call (compilation included).
  """

  states: Any
  alive: np.ndarray
  steps: np.ndarray
  losses: np.ndarray
  applied: np.ndarray
  auc: np.ndarray
  logloss: np.ndarray
  test_auc: np.ndarray
  test_logloss: np.ndarray
  seconds: float


def split_eval_mask(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Splits the real eval examples into a first ('valid') and a second ('test') half.

  Searches select on the valid half; the test half is only reported, so the best
  trial's test AUC is an unbiased comparison with the default config's.
  """
  real = np.cumsum(mask > 0)
  first = real <= (real[-1] + 1) // 2 if real.size else real.astype(bool)
  return mask * first, mask * ~first


def trial_mesh(num_devices: int = 0) -> jax.sharding.Mesh:
  """A 1-D ('trial',) mesh (Auto axes) over the first `num_devices` local devices (0 = all)."""
  devices = jax.local_devices()
  n = len(devices) if num_devices <= 0 else num_devices
  if n > len(devices):
    raise ValueError(f"num_devices={num_devices} but only {len(devices)} devices are visible")
  return jax.sharding.Mesh(np.array(devices[:n]), ("trial",),
                           axis_types=(jax.sharding.AxisType.Auto,))


def stack_hparams(hparams: Sequence[Mapping[str, Any]],
                  data_defaults: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
  """Per-trial dicts (defaults filled, checked) -> `arch.DYNAMIC_KEYS` -> [W] float32.

  A bag's pooling key (`bag_pooling`) or a table's dim key (`table_dims`) that some trial
  sets is stacked too (a pooling as its code); a trial without it takes
  `data_defaults[key]` (the data set's: `bag_pooling.default_codes` and
  `table_dims.default_dims`).

  Raises:
    ValueError: a pooling or dim key without a default (not a bag or table of the data set).
  """
  resolved = [arch_lib.resolve_hparams(h) for h in hparams]
  defaults = dict(data_defaults or {})
  data_keys = sorted({k for h in resolved for k in h if k not in arch_lib.DYNAMIC_DEFAULTS})
  for key in data_keys:
    if key not in defaults:
      what = "a table" if table_dims.dimmed_table(key) is not None else "a multi_hot feature"
      raise ValueError(f"config key {key!r}: not {what} of the data set (known: "
                       f"{', '.join(sorted(defaults)) or 'none'})")
  stacked = {k: np.asarray([h[k] for h in resolved], np.float32) for k in arch_lib.DYNAMIC_KEYS}
  stacked.update({k: np.asarray([h.get(k, defaults[k]) for h in resolved], np.float32)
                  for k in data_keys})
  return stacked


def stacked_hparams(hparams: Mapping[str, Any], width: int) -> dict[str, np.ndarray]:
  """`arch.DYNAMIC_KEYS` -> [W] float32: the given values (checked), defaults elsewhere;
  bags' pooling codes and tables' dims only when given (the program pools and reads the
  others the data set's way);
  a mixed program's `lane_optimizers.LANE_KEY` -> [W] int32 and a program of several row
  widths' `lane_optimizers.ROW_WIDTH_KEY` -> [W] float32 (each >= 1) when given."""
  defaults = arch_lib.resolve_hparams({})
  stacked = {}
  for key, value in {**{k: None for k in arch_lib.DYNAMIC_KEYS}, **dict(hparams)}.items():
    if key == lane_optimizers.LANE_KEY:  # a mixed program's per-lane row optimizer index
      value = np.asarray(jax.device_get(value))
      if value.shape != (width,) or (value < 0).any() or (value != np.round(value)).any():
        raise ValueError(f"hparams[{key!r}] must be ({width},) non-negative integers, got "
                         f"{value.tolist()}")
      stacked[key] = value.astype(np.int32)
      continue
    if key == lane_optimizers.ROW_WIDTH_KEY:  # each lane's own row width (rowwise_adagrad)
      value = np.asarray(jax.device_get(value), np.float32)
      if value.shape != (width,) or not (np.isfinite(value) & (value >= 1)).all():
        raise ValueError(f"hparams[{key!r}] must be ({width},) finite row widths >= 1, got "
                         f"{value.tolist()}")
      stacked[key] = value
      continue
    if value is None:
      value = np.full((width,), defaults[key], np.float32)
    else:
      value = np.asarray(jax.device_get(value), np.float32)
      for v in value.reshape(-1):
        arch_lib.dynamic_value(key, v)
    if value.shape != (width,):
      raise ValueError(f"hparams[{key!r}] has shape {value.shape}, expected ({width},)")
    stacked[key] = value
  return stacked


# Traces of cohort programs per (arch, resume): a compile counter for no-recompile checks.
_TRACES: collections.Counter = collections.Counter()


def _num_traces() -> int:
  """How many times any cohort program was traced (compiled) in this process."""
  return sum(_TRACES.values())


@functools.lru_cache(maxsize=64)
def cohort_program(arch: ArchSpec, spec, resume: bool, masked: bool = False,
                   num_rows: int | None = None, ragged: bool = False,
                   table_starts: tuple[int, ...] | None = None,
                   compiler_options: tuple[tuple[str, str], ...] = ()):
  """The jitted cohort program of `arch` on data set `spec` (cached, shared by runners).

  `jax.jit` then keeps one executable per (width, step count, input shardings).
  Resumed states are donated. `masked`: the padded program of a shape bucket whose
  superset is `arch` (`sfjax.cohorts.shape_buckets.buckets`; it takes per-trial dense masks).
  `num_rows`, `table_starts`: rows of a fresh trial's table and where each table's begin
  (`TrialData.num_rows`, `TrialData.table_starts`). `ragged`: each
  trial takes its own step range (`trial_program.make_trial_fn`). `compiler_options`:
  XLA's, as (name, value) pairs (`CTRTask.compiler_options`).
  """
  graphdef = trial_program.program_graphdef(arch, spec)
  fn = trial_program.make_cohort_fn(
      arch, spec, graphdef, resume=resume, masked=masked, num_rows=num_rows, ragged=ragged,
      table_starts=table_starts, on_trace=lambda: _TRACES.update([(arch, resume, masked, ragged)]))
  return jax.jit(fn, donate_argnums=(2,) if resume or masked or ragged else (),
                 compiler_options=dict(compiler_options))


def _placer(mesh, width: int):
  """Puts a host tree on device: per trial sharded over `mesh`'s 'trial' axis (when
  `width` divides evenly), or replicated; unsharded without a mesh."""
  def place(tree, per_trial: bool):
    if mesh is None or width % mesh.size:
      return jax.tree.map(jnp.asarray, tree)
    return jax.device_put(tree, NamedSharding(mesh, P("trial") if per_trial else P()))
  return place


def cohort_eval_metrics(data: TrialData, logits: np.ndarray, alive: np.ndarray) -> np.ndarray:
  """[4, W] auc, logloss, test_auc, test_logloss of [W, N] eval logits (NaN if not alive)."""
  labels = data.eval_labels
  valid_mask, test_mask = split_eval_mask(data.eval_mask)
  metrics = np.full((4, logits.shape[0]), np.nan)
  for i in np.flatnonzero(alive):
    probs = metrics_lib.sigmoid(logits[i])
    metrics[:, i] = (metrics_lib.auc(labels, logits[i], valid_mask),
                     metrics_lib.logloss(labels, probs, valid_mask),
                     metrics_lib.auc(labels, logits[i], test_mask),
                     metrics_lib.logloss(labels, probs, test_mask))
  return metrics


def call_cohort(data: TrialData, mesh, arch: ArchSpec, hparams: Mapping[str, Any], seeds,
                start, end, init_states=None, dense_masks=None) -> CohortOutput:
  """Runs W trials of `data`'s task over steps `[start, end)` as one program call.

  Args:
    data: the task's TrialData (batches, eval set, table rows).
    mesh: None, or a ('trial',) mesh to shard the trial axis over.
    arch: their architecture.
    hparams: `arch.DYNAMIC_KEYS` -> [W] values (missing keys take defaults), and
      optionally bags' pooling keys -> [W] codes (`bag_pooling`), tables' dim keys ->
      [W] dims (`table_dims`) and, for an `arch`
      of several row optimizers (`lane_optimizers`), `LANE_KEY` -> [W] lane indices.
    seeds: [W] ints; a fresh trial's parameters and table are drawn from its seed.
    start, end: the global step range: ints (all trials), or [W] ints, one range
      per trial (a ragged program: `init_states` required; the scan runs the
      longest range and a shorter trial's remaining loop steps are not applied).
    init_states: None (fresh trials, `start` must be 0) or a stacked [W]
      TrainState (host or device; device arrays are donated) at step `start`.
    dense_masks: None, or stacked [W] dense masks of padded trials of a shape
      bucket whose superset is `arch` (`buckets.pad_state`; `init_states` required).

  Returns:
    CohortOutput.
  """
  seeds = np.asarray(seeds, np.int32).reshape(-1)
  width = seeds.shape[0]
  stacked = stacked_hparams(hparams, width)
  starts = np.broadcast_to(np.asarray(start, np.int64), (width,))
  ends = np.broadcast_to(np.asarray(end, np.int64), (width,))
  if (starts < 0).any() or (ends < starts).any():
    raise ValueError(f"run_stacked: invalid step ranges starts={starts.tolist()} "
                     f"ends={ends.tolist()}")
  ragged = bool((starts != starts[0]).any() or (ends != ends[0]).any())
  if init_states is None and (starts != 0).any():
    raise ValueError(f"fresh trials start at step 0, got start={start}; "
                     "pass init_states to resume")
  if ragged and init_states is None:
    raise ValueError("run_stacked: per-trial step ranges need init_states (host-initialise "
                     "the fresh trials)")
  if dense_masks is not None and init_states is None:
    raise ValueError("dense_masks need init_states (padded trials start from padded states)")
  if init_states is not None:
    # Host leaves are copied: the program donates its input state, and on CPU a
    # transferred numpy buffer may be aliased, so the caller's arrays would change.
    init_states = jax.tree.map(lambda x: np.array(x) if isinstance(x, np.ndarray) else x,
                               init_states)
  place = _placer(mesh, width)
  t0 = time.perf_counter()
  lo, hi = int(starts.min()), int(ends.max())
  masked = dense_masks is not None
  program = cohort_program(arch, data.spec, init_states is not None, masked, data.num_rows,
                           ragged, data.table_starts, data.task.compiler_options)
  args = [place(stacked, True), place(seeds, True),
          None if init_states is None else place(init_states, True),
          place(data.train_steps(lo, hi), False), place(data.eval_batches, False),
          place(dense_masks, True) if masked else None]
  if ragged:
    args += [place(np.asarray(starts - lo, np.int32), True),
             place(np.asarray(ends - starts, np.int32), True),
             jnp.arange(int((ends - starts).max()), dtype=jnp.int32)]
  out = program(*args)
  alive, steps, losses, applied, logits = jax.device_get(
      (out.alive, out.state.step, out.losses, out.applied, out.logits))
  seconds = time.perf_counter() - t0
  auc, logloss, test_auc, test_logloss = cohort_eval_metrics(data, logits.reshape(width, -1), alive)
  return CohortOutput(out.state, alive, steps, losses, applied, auc, logloss, test_auc,
                      test_logloss, seconds)

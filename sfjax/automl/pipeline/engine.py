"""The pipeline engine: `run_pipeline(config, workdir, kinds) -> report`, resumable per step.

VEGA's pipeline (arXiv 2011.01507): ordered steps whose outputs are the next
steps' inputs. Each step runs in `WORKDIR/steps/<index>_<name>/`:

  status.json   'running' when it starts; 'done' (with best_metrics, wall_s) or
                'failed' (with the error and traceback) when it ends;
  output.json   the hand-off, written (atomically) before status 'done'.

Rerunning on the same workdir skips the done steps (their outputs are read back),
and calls the interrupted or failed step's `run` again in its own directory: the
step resumes its own work (a search from its study journal, training from the
trainer's checkpoints). A step that raises is recorded 'failed' and the steps
after it are 'skipped'; KeyboardInterrupt / SystemExit propagate (the step stays
'running' and resumes next time). A step whose kind has library defaults runs
with those defaults and its block's overrides merged here (`effective_blocks`).
`WORKDIR/pipeline.json` records each step's type and effective block: rerunning
with a changed block (or changed library defaults) for a step already in the
workdir is an error naming the fields (steps may be appended).

At the end `report.json` ({"status", "steps": [...], **application fields}) and
`summary.txt` (`pipeline_report.summary_table`) are written atomically.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import logging

from sfjax.automl.pipeline import pipeline_report
from sfjax.automl.pipeline.step_specs import (
  PipelineConfigError,
  StepContext,
  StepKind,
  StepOutput,
  StepResult,
  StepSpec,
  effective_blocks,
  effective_config,
  parse_steps,
)
from sfjax.core import without_xla_cpu_dots
from sfjax.core.atomic import atomic_write

_STEPS_DIR = "steps"
_STATUS_FILE = "status.json"
_OUTPUT_FILE = "output.json"
SETTINGS_FILE = "pipeline.json"
_REPORT_FILE = "report.json"
_SUMMARY_FILE = "summary.txt"
LOCK_FILE = "pipeline.lock"

# finalize(step results, workdir) -> the report's top-level fields (`run_pipeline`).
Finalize = Callable[[Sequence[StepResult], str], Mapping[str, Any]]


class PipelineLockedError(RuntimeError):
  """Another process runs a pipeline in this workdir."""


def _write_json(path: str, data: Any) -> None:
  atomic_write(path, json.dumps(pipeline_report.json_safe(data), indent=2, sort_keys=True,
                                allow_nan=False) + "\n")


def read_status(step_dir: str) -> dict[str, Any] | None:
  """The step directory's status.json, or None when the step never started."""
  path = os.path.join(step_dir, _STATUS_FILE)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _block_dict(block) -> Any:
  """A config block as JSON data, less the fields that change float rounding only
  (`sfjax.core.without_xla_cpu_dots`: a rerun may change them, e.g. on other hardware)."""
  data = block.to_dict() if hasattr(block, "to_dict") else dict(block)
  return without_xla_cpu_dots(json.loads(json.dumps(data, default=str)))


def settings_record(config, specs: Sequence[StepSpec]) -> dict[str, Any]:
  """What the workdir's results depend on: the shared config and each step's type and
  (effective) block."""
  shared = {k: v for k, v in _block_dict(config).items() if k not in ("pipeline", "steps")}
  return {"shared": shared,
          "steps": {s.name: {"index": s.index, "type": s.kind, "block": _block_dict(s.block)}
                    for s in specs}}


def config_differences(stored, given, prefix: str = "") -> list[str]:
  """Every leaf where two nested dicts differ, as '<dotted.path>: stored X, given Y'.

  A workdir's recorded settings against a rerun's (this engine's and the CTR
  search's `check_search_settings`); `prefix` starts every path (a key missing on one
  side reads None).
  """
  if isinstance(stored, dict) and isinstance(given, dict):
    out = []
    for key in sorted(set(stored) | set(given)):
      path = f"{prefix}.{key}" if prefix else str(key)
      out += config_differences(stored.get(key), given.get(key), path)
    return out
  return [] if stored == given else [f"{prefix}: stored {stored!r}, given {given!r}"]


def check_settings(workdir: str, record: Mapping[str, Any]) -> None:
  """Checks `record` against the workdir's pipeline.json (steps in both must agree), then
  stores the union.

  Raises:
    PipelineConfigError: naming every differing field.
  """
  path = os.path.join(workdir, SETTINGS_FILE)
  stored = {"shared": record["shared"], "steps": {}}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      stored = json.load(f)
  diffs = config_differences(stored["shared"], record["shared"], "config")
  for name in sorted(set(stored["steps"]) & set(record["steps"])):
    diffs += config_differences(stored["steps"][name], record["steps"][name], f"steps.{name}")
  if diffs:
    raise PipelineConfigError(f"{path}: this workdir holds a pipeline run with a different "
                              "config; use another --workdir or the same config. Differences: "
                              + "; ".join(diffs[:20]))
  _write_json(path, {"shared": record["shared"], "steps": {**stored["steps"], **record["steps"]}})


def _done_result(spec: StepSpec, step_dir: str, status: Mapping[str, Any]) -> StepResult:
  with open(os.path.join(step_dir, _OUTPUT_FILE), encoding="utf-8") as f:
    output = json.load(f)
  return StepResult(spec.name, spec.kind, "done", status.get("best_metrics", {}), output,
                    status.get("wall_s"))


def run_step(spec: StepSpec, kind: StepKind, workdir: str, config,
             previous: Sequence[StepResult]) -> StepResult:
  """Runs (or resumes) one step in its directory and records its status.

  Exceptions of the step become a 'failed' result; BaseExceptions that are not
  Exceptions (KeyboardInterrupt, SystemExit) propagate with the status left 'running'.
  """
  step_dir = os.path.join(workdir, _STEPS_DIR, spec.dirname)
  os.makedirs(step_dir, exist_ok=True)
  before = read_status(step_dir) or {}
  attempt = int(before.get("attempt", 0)) + 1
  base = {"name": spec.name, "type": spec.kind, "attempt": attempt}
  _write_json(os.path.join(step_dir, _STATUS_FILE), {**base, "status": "running",
                                                    "started_at": time.time()})
  logging.info("pipeline step %d %s (%s): %s", spec.index, spec.name, spec.kind,
               "resuming" if before else "starting")
  started = time.perf_counter()
  ctx = StepContext(spec, step_dir, workdir, config, tuple(previous))
  try:
    out = kind.run(ctx)
    if not isinstance(out, StepOutput):
      raise TypeError(f"step kind {spec.kind!r} returned {type(out).__name__}, not a StepOutput")
    metrics, output = dict(out.best_metrics), dict(out.output)
    _write_json(os.path.join(step_dir, _OUTPUT_FILE), output)
  except Exception as e:  # pylint: disable=broad-except  (recorded; later steps are skipped)
    wall = time.perf_counter() - started
    error = f"{type(e).__name__}: {e}"
    logging.error("pipeline step %s failed: %s", spec.name, error)
    _write_json(os.path.join(step_dir, _STATUS_FILE),
                {**base, "status": "failed", "error": error, "wall_s": wall,
                 "traceback": traceback.format_exc()})
    return StepResult(spec.name, spec.kind, "failed", {}, {}, wall, error)
  wall = time.perf_counter() - started
  _write_json(os.path.join(step_dir, _STATUS_FILE),
              {**base, "status": "done", "best_metrics": metrics, "wall_s": wall})
  return StepResult(spec.name, spec.kind, "done", pipeline_report.json_safe(metrics),
                    pipeline_report.json_safe(output), wall)


def _lock(workdir: str):
  handle = open(os.path.join(workdir, LOCK_FILE), "a", encoding="utf-8")
  try:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.close()
    raise PipelineLockedError(f"{workdir}: another pipeline process runs in this workdir") from None
  return handle


def run_pipeline(config, workdir: str, kinds: Mapping[str, StepKind],
                 finalize: Finalize | None = None) -> dict[str, Any]:
  """Runs (or resumes) the pipeline `config` describes in `workdir`.

  Args:
    config: a ConfigDict with `pipeline.order` and `steps.<name>` blocks
      (`step_specs.parse_steps`); other top-level blocks are shared by the steps.
    workdir: the pipeline's directory.
    kinds: the step registry `{type: StepKind}` (the application's).
    finalize: `finalize(results, workdir) -> {field: value}`: application fields
      added to the top level of the report (called even when a step failed).

  Returns:
    The report (also in `workdir/report.json`): `{"status": "done"|"failed",
    "steps": [{"name", "type", "status", "best_metrics", "wall_s"[, "error"]}, ...],
    **finalize(...)}`.

  Raises:
    PipelineConfigError: a bad config (naming the field) or a workdir made by
      another config. PipelineLockedError: the workdir is in use.
  """
  blocks = effective_blocks(config, kinds)
  specs = parse_steps(config, kinds, blocks)
  step_config = effective_config(config, blocks)  # what the steps see: defaults + overrides
  os.makedirs(workdir, exist_ok=True)
  lock = _lock(workdir)
  try:
    check_settings(workdir, settings_record(config, specs))
    results: list[StepResult] = []
    for spec in specs:
      if any(r.status != "done" for r in results):
        results.append(StepResult(spec.name, spec.kind, "skipped", {}, {}, None))
        continue
      step_dir = os.path.join(workdir, _STEPS_DIR, spec.dirname)
      status = read_status(step_dir)
      if status is not None and status.get("status") == "done":
        logging.info("pipeline step %d %s: done before, skipped", spec.index, spec.name)
        results.append(_done_result(spec, step_dir, status))
        continue
      results.append(run_step(spec, kinds[spec.kind], workdir, step_config, results))
    extra = dict(finalize(results, workdir)) if finalize is not None else {}
    report = pipeline_report.build_report(results, extra)
    _write_json(os.path.join(workdir, _REPORT_FILE), report)
    atomic_write(os.path.join(workdir, _SUMMARY_FILE), pipeline_report.summary_table(report))
    return report
  finally:
    lock.close()

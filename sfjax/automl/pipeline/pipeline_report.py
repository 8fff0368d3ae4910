"""The pipeline's report: one JSON object and a readable table of it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sfjax.automl.pipeline.step_specs import StepResult

_STATUSES = ("done", "failed", "skipped")


def json_safe(value: Any) -> Any:
  """A copy of `value` that strict JSON can hold: non-finite floats become None,
  tuples lists, numpy scalars Python numbers."""
  if isinstance(value, Mapping):
    return {str(k): json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_safe(v) for v in value]
  if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def build_report(results: Sequence[StepResult], extra: Mapping[str, Any]) -> dict[str, Any]:
  """`{"status", "steps": [{"name", "type", "status", "best_metrics", "wall_s"[, "error"]}],
  **extra}`; status is 'done' when every step is done, else 'failed'.

  Raises:
    ValueError: `extra` reuses a reserved key ('status', 'steps') or a step has an
      unknown status.
  """
  clash = sorted({"status", "steps"} & set(extra))
  if clash:
    raise ValueError(f"report fields {clash} are reserved by the pipeline")
  steps = []
  for r in results:
    if r.status not in _STATUSES:
      raise ValueError(f"step {r.name!r}: status {r.status!r} is not one of {_STATUSES}")
    row = {"name": r.name, "type": r.kind, "status": r.status,
           "best_metrics": dict(r.best_metrics), "wall_s": r.wall_s}
    if r.error is not None:
      row["error"] = r.error
    steps.append(row)
  status = "done" if all(r.status == "done" for r in results) else "failed"
  return json_safe({"status": status, "steps": steps, **extra})


def _format(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
  if value is None:
    return "-"
  return str(value)


def _metrics_text(metrics: Mapping[str, Any], limit: int = 4) -> str:
  items = [f"{k}={_format(v)}" for k, v in list(metrics.items())[:limit]]
  return " ".join(items) + (" ..." if len(metrics) > limit else "")


def summary_table(report: Mapping[str, Any]) -> str:
  """The report as aligned text: one row per step, then the top-level scalar fields."""
  header = ("#", "step", "type", "status", "wall_s", "best_metrics")
  rows = [header]
  for i, s in enumerate(report["steps"]):
    wall = "-" if s["wall_s"] is None else f"{s['wall_s']:.1f}"
    detail = s.get("error") or _metrics_text(s["best_metrics"])
    rows.append((str(i), s["name"], s["type"], s["status"], wall, detail))
  widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
  lines = ["  ".join(r[c].ljust(widths[c]) for c in range(len(widths))) + "  " + r[-1]
           for r in rows]
  lines.insert(1, "-" * (sum(widths) + 2 * len(widths) + len("best_metrics")))
  lines.append(f"pipeline: {report['status']}")
  for key, value in report.items():
    if key in ("status", "steps"):
      continue
    text = _metrics_text(value, limit=6) if isinstance(value, Mapping) else _format(value)
    lines.append(f"{key}: {text}")
  return "\n".join(lines) + "\n"

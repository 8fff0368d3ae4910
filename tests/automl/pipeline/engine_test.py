"""Tests of the pipeline engine: order, hand-off, skip done, resume, failure, report."""

import json
import os

import ml_collections
import pytest

from sfjax.automl.pipeline import engine
from sfjax.automl.pipeline.step_specs import (
  MissingInputError,
  PipelineConfigError,
  StepKind,
  StepOutput,
)


def _config(order="a,b,c", **blocks):
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.pipeline = ml_collections.ConfigDict({"order": order})
  c.steps = ml_collections.ConfigDict()
  for name in order.split(","):
    c.steps[name] = ml_collections.ConfigDict({"type": "add", "amount": 1})
  for name, block in blocks.items():
    c.steps[name] = ml_collections.ConfigDict(block)
  return c


class _Kinds:
  """Step kinds that log their calls: 'add' adds its amount to the previous total."""

  def __init__(self):
    self.calls = []

  def add(self, ctx):
    self.calls.append(ctx.spec.name)
    total = ctx.latest("total", 0) + ctx.block.amount
    with open(os.path.join(ctx.workdir, "mine.txt"), "w") as f:  # a file in its own dir
      f.write(str(total))
    return StepOutput({"total": float(total)},
                      {"total": total, "file": ctx.relative(os.path.join(ctx.workdir, "mine.txt"))})

  def boom(self, ctx):
    self.calls.append(ctx.spec.name)
    raise RuntimeError("planned failure")

  def interrupted_once(self, ctx):
    """Dies (KeyboardInterrupt, like a kill) on its first call after saving progress."""
    self.calls.append(ctx.spec.name)
    progress = os.path.join(ctx.workdir, "progress")
    if not os.path.exists(progress):
      with open(progress, "w") as f:
        f.write("half")
      raise KeyboardInterrupt
    with open(progress) as f:
      resumed_from = f.read()
    return StepOutput({}, {"resumed_from": resumed_from, "total": ctx.latest("total")})

  def needs_pairs(self, ctx):
    return StepOutput({}, {"pairs": ctx.latest("kept_pairs")})

  def registry(self):
    return {"add": StepKind(self.add), "boom": StepKind(self.boom),
            "resumable": StepKind(self.interrupted_once),
            "needs_pairs": StepKind(self.needs_pairs)}


def test_steps_run_in_order_and_hand_off(tmp_path):
  kinds = _Kinds()
  config = _config("a,b,c", b={"type": "add", "amount": 5})
  report = engine.run_pipeline(config, str(tmp_path), kinds.registry(),
                               finalize=lambda results, wd: {"final": results[-1].output["total"]})
  assert kinds.calls == ["a", "b", "c"]
  assert report["status"] == "done" and report["final"] == 7
  assert [s["name"] for s in report["steps"]] == ["a", "b", "c"]
  assert [s["best_metrics"]["total"] for s in report["steps"]] == [1.0, 6.0, 7.0]
  assert all(s["status"] == "done" and s["wall_s"] >= 0 for s in report["steps"])
  for i, name in enumerate("abc"):
    step_dir = tmp_path / "steps" / f"{i}_{name}"
    assert json.loads((step_dir / "status.json").read_text())["status"] == "done"
    out = json.loads((step_dir / "output.json").read_text())
    assert (tmp_path / out["file"]).read_text() == str(out["total"])
  assert json.loads((tmp_path / "report.json").read_text()) == report
  table = (tmp_path / "summary.txt").read_text()
  assert "2  c     add   done" in table and "final: 7" in table


def test_rerun_skips_done_steps(tmp_path):
  kinds = _Kinds()
  first = engine.run_pipeline(_config(), str(tmp_path), kinds.registry())
  again = engine.run_pipeline(_config(), str(tmp_path), kinds.registry())
  assert kinds.calls == ["a", "b", "c"]  # nothing ran the second time
  assert again["steps"] == first["steps"]


def test_interrupted_step_resumes_and_done_steps_are_skipped(tmp_path):
  kinds = _Kinds()
  config = _config("a,b,c", b={"type": "resumable"})
  with pytest.raises(KeyboardInterrupt):
    engine.run_pipeline(config, str(tmp_path), kinds.registry())
  status = json.loads((tmp_path / "steps" / "1_b" / "status.json").read_text())
  assert status["status"] == "running" and not (tmp_path / "report.json").exists()
  report = engine.run_pipeline(config, str(tmp_path), kinds.registry())
  assert kinds.calls == ["a", "b", "b", "c"]  # 'a' skipped, 'b' called again, then 'c'
  out = json.loads((tmp_path / "steps" / "1_b" / "output.json").read_text())
  assert out == {"resumed_from": "half", "total": 1}
  assert json.loads((tmp_path / "steps" / "1_b" / "status.json").read_text())["attempt"] == 2
  assert report["status"] == "done" and report["steps"][2]["best_metrics"] == {"total": 2.0}


def test_failed_step_then_skipped_steps_and_retry(tmp_path):
  kinds = _Kinds()
  config = _config("a,b,c", b={"type": "boom"})
  report = engine.run_pipeline(config, str(tmp_path), kinds.registry(),
                               finalize=lambda results, wd: {"n": len(results)})
  assert [s["status"] for s in report["steps"]] == ["done", "failed", "skipped"]
  assert report["status"] == "failed" and report["n"] == 3
  assert report["steps"][1]["error"] == "RuntimeError: planned failure"
  assert report["steps"][2]["wall_s"] is None
  status = json.loads((tmp_path / "steps" / "1_b" / "status.json").read_text())
  assert status["status"] == "failed" and "planned failure" in status["traceback"]
  assert not (tmp_path / "steps" / "2_c").exists()
  assert "RuntimeError: planned failure" in (tmp_path / "summary.txt").read_text()
  engine.run_pipeline(config, str(tmp_path), kinds.registry())  # a failed step is retried
  assert kinds.calls == ["a", "b", "b"]


def test_missing_input_fails_the_step_naming_the_key(tmp_path):
  config = _config("a,p", p={"type": "needs_pairs"})
  report = engine.run_pipeline(config, str(tmp_path), _Kinds().registry())
  assert report["steps"][1]["status"] == "failed"
  assert "MissingInputError" in report["steps"][1]["error"]
  assert "'kept_pairs'" in report["steps"][1]["error"] and "['a']" in report["steps"][1]["error"]
  assert issubclass(MissingInputError, RuntimeError)


def test_changed_block_of_an_existing_step_is_refused(tmp_path):
  kinds = _Kinds()
  engine.run_pipeline(_config("a,b"), str(tmp_path), kinds.registry())
  changed = _config("a,b", b={"type": "add", "amount": 3})
  with pytest.raises(PipelineConfigError, match=r"steps\.b\.block\.amount: stored 1, given 3"):
    engine.run_pipeline(changed, str(tmp_path), kinds.registry())
  other_seed = _config("a,b")
  other_seed.seed = 4
  with pytest.raises(PipelineConfigError, match=r"config\.seed: stored 0, given 4"):
    engine.run_pipeline(other_seed, str(tmp_path), kinds.registry())
  # Appending a step keeps the finished ones.
  report = engine.run_pipeline(_config("a,b,c"), str(tmp_path), kinds.registry())
  assert kinds.calls == ["a", "b", "c"] and report["steps"][-1]["best_metrics"]["total"] == 3.0


def test_xla_cpu_dots_is_left_out_of_the_record_so_a_rerun_may_change_it(tmp_path):
  kinds = _Kinds()

  def config(choice):
    c = _config("a,b", b={"type": "add", "amount": 1, "trainer": {"train": {"xla_cpu_dots": choice}}})
    c.task = ml_collections.ConfigDict({"batch_size": 8, "xla_cpu_dots": choice})
    return c

  engine.run_pipeline(config("eigen"), str(tmp_path), kinds.registry())
  with open(tmp_path / engine.SETTINGS_FILE) as f:
    stored = json.load(f)
  assert stored["shared"]["task"] == {"batch_size": 8}
  assert stored["steps"]["b"]["block"]["trainer"] == {"train": {}}
  engine.run_pipeline(config("xla"), str(tmp_path), kinds.registry())  # resumes: rounding only
  assert kinds.calls == ["a", "b"]  # both done in the first run, skipped in the second


def test_a_kind_with_defaults_runs_its_defaults_plus_the_blocks_overrides(tmp_path):
  amounts = {"amount": 10}  # the library's default of the kind, changed below
  seen = []

  def scaled(ctx):
    seen.append((ctx.block.to_dict(), ctx.config.steps.spare.to_dict()))
    return StepOutput({"total": float(ctx.block.amount * ctx.block.factor)}, {})

  kinds = {"scaled": StepKind(scaled, defaults=lambda: ml_collections.ConfigDict(
      {"amount": amounts["amount"], "factor": 1}))}
  config = _config("s", s={"type": "scaled", "factor": 3}, spare={"type": "scaled"})
  report = engine.run_pipeline(config, str(tmp_path), kinds)
  assert report["steps"][0]["best_metrics"]["total"] == 30.0
  # The step sees its effective block, and so every block of the config (an unlisted one too).
  assert seen == [({"amount": 10, "factor": 3, "type": "scaled"},
                   {"amount": 10, "factor": 1, "type": "scaled"})]
  stored = json.loads((tmp_path / engine.SETTINGS_FILE).read_text())
  assert stored["steps"]["s"]["block"] == {"amount": 10, "factor": 3, "type": "scaled"}
  assert config.steps.s.to_dict() == {"type": "scaled", "factor": 3}  # the config is unchanged
  amounts["amount"] = 11  # a changed library default is a changed step: refused on resume
  with pytest.raises(PipelineConfigError, match=r"steps\.s\.block\.amount: stored 10, given 11"):
    engine.run_pipeline(config, str(tmp_path), kinds)
  typo = _config("s", s={"type": "scaled", "factr": 3})
  with pytest.raises(PipelineConfigError, match=r"steps\.s\.factr: .*did you mean steps\.s\.factor"):
    engine.run_pipeline(typo, str(tmp_path / "typo"), kinds)
  assert not (tmp_path / "typo").exists()  # refused before anything is written


def test_a_second_process_on_the_workdir_is_refused(tmp_path):
  held = engine._lock(str(tmp_path))
  try:
    with pytest.raises(engine.PipelineLockedError):
      engine.run_pipeline(_config(), str(tmp_path), _Kinds().registry())
  finally:
    held.close()


def test_a_step_must_return_a_step_output(tmp_path):
  kinds = {"bad": StepKind(lambda ctx: {"auc": 1.0})}
  config = _config("a", a={"type": "bad"})
  report = engine.run_pipeline(config, str(tmp_path), kinds)
  assert report["steps"][0]["status"] == "failed" and "not a StepOutput" in report["steps"][0]["error"]

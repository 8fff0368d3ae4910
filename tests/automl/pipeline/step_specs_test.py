"""Tests of pipeline config parsing: bad configs fail naming the field."""

import ml_collections
import pytest

from sfjax.automl.pipeline.step_specs import (
  MissingInputError,
  PipelineConfigError,
  StepContext,
  StepKind,
  StepOutput,
  StepResult,
  StepSpec,
  parse_steps,
)
from sfjax.core.errors import ConfigError


def _check_amount(block, field):
  if block.amount < 0:
    raise ConfigError(f"config field {field}.amount: must be >= 0, got {block.amount}")


KINDS = {"add": StepKind(lambda ctx: StepOutput({}, {}), check=_check_amount),
         "noop": StepKind(lambda ctx: StepOutput({}, {}))}


def _config(order, steps):
  return ml_collections.ConfigDict({"pipeline": {"order": order}, "steps": steps})


def test_order_and_blocks_parse():
  specs = parse_steps(_config(" b , a", {"a": {"type": "noop"}, "b": {"type": "add", "amount": 2},
                                         "unused": {"type": "zzz"}}), KINDS)
  assert [(s.index, s.name, s.kind) for s in specs] == [(0, "b", "add"), (1, "a", "noop")]
  assert specs[0].dirname == "0_b" and specs[1].field == "steps.a" and specs[0].block.amount == 2
  assert parse_steps(_config(["a"], {"a": {"type": "noop"}}), KINDS)[0].name == "a"


@pytest.mark.parametrize("order, steps, field", [
    ("", {}, "pipeline.order: no steps"),
    (3, {}, "pipeline.order: expected"),
    ("a,a", {"a": {"type": "noop"}}, "pipeline.order: repeated"),
    ("A-1", {}, "pipeline.order: step name 'A-1'"),
    ("a,b", {"a": {"type": "noop"}}, "steps.b: missing"),
    ("a", {"a": {"amount": 1}}, "steps.a.type: missing"),
    ("a", {"a": {"type": 3}}, "steps.a.type: expected a string"),
    ("a", {"a": {"type": "nas"}}, "steps.a.type: unknown step kind 'nas' (known: add, noop)"),
    ("a", {"a": {"type": "add", "amount": -1}}, "steps.a.amount: must be >= 0"),
])
def test_bad_configs_name_the_field(order, steps, field):
  with pytest.raises(ConfigError, match=f"config field {field}".replace("(", r"\(").replace(")", r"\)")):
    parse_steps(_config(order, steps), KINDS)


def test_missing_order_names_the_field():
  with pytest.raises(PipelineConfigError, match="pipeline.order: missing"):
    parse_steps(ml_collections.ConfigDict({"steps": {}}), KINDS)


def test_context_latest_takes_the_newest_producer(tmp_path):
  def done(name, out):
    return StepResult(name, "noop", "done", {}, out, 1.0)

  ctx = StepContext(StepSpec(2, "c", "noop", {}), str(tmp_path / "steps" / "2_c"), str(tmp_path),
                    None, (done("a", {"best_config": 1, "x": 0}), done("b", {"best_config": 2})))
  assert ctx.latest("best_config") == 2 and ctx.latest("x") == 0
  assert ctx.latest("nothing", None) is None
  with pytest.raises(MissingInputError, match=r"needs 'pairs'.*\['a', 'b'\]"):
    ctx.latest("pairs")
  inside = tmp_path / "steps" / "2_c" / "w.npy"
  assert ctx.relative(str(inside)) == "steps/2_c/w.npy"
  assert ctx.resolve("steps/2_c/w.npy") == str(inside)

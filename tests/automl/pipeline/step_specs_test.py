"""Tests of pipeline config parsing: bad configs fail naming the field; defaults + overrides."""

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
  apply_overrides,
  effective_blocks,
  effective_config,
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


def _scaled_defaults():
  return ml_collections.ConfigDict({"amount": 1, "scale": 2.0, "inner": {"depth": 3, "name": "x"}})


def _kinds_with_defaults():
  return {**KINDS, "scaled": StepKind(lambda ctx: StepOutput({}, {}), check=_check_amount,
                                      defaults=_scaled_defaults)}


def test_a_block_of_overrides_merges_onto_the_kinds_defaults():
  config = _config("s", {"s": {"type": "scaled", "inner": {"depth": 5}},
                         "t": {"type": "scaled", "scale": 3}, "n": {"type": "noop", "own": 1}})
  (spec,) = parse_steps(config, _kinds_with_defaults())
  assert spec.block.to_dict() == {"amount": 1, "scale": 2.0, "inner": {"depth": 5, "name": "x"},
                                  "type": "scaled"}
  blocks = effective_blocks(config, _kinds_with_defaults())
  assert blocks["t"].scale == 3.0 and blocks["t"].inner.depth == 3  # unlisted: merged too
  assert blocks["n"] is config.steps.n  # a kind without defaults: the block as written
  effective = effective_config(config, blocks)
  assert effective.steps.t.inner.name == "x" and "inner" not in config.steps.t  # a copy
  assert parse_steps(effective, _kinds_with_defaults())[0].block.to_dict() == spec.block.to_dict()


@pytest.mark.parametrize("block, message", [
    ({"amout": 2}, r"steps\.s\.amout: unknown setting of step 's' \(scaled\); did you mean "
                   r"steps\.s\.amount\? \(known: amount, inner, scale\)"),
    ({"inner": {"dpeth": 4}}, r"steps\.s\.inner\.dpeth: unknown setting of step 's' \(scaled\); "
                              r"did you mean steps\.s\.inner\.depth\?"),
    ({"zzz": 1}, r"steps\.s\.zzz: unknown setting of step 's' \(scaled\) \(known: "),
    ({"inner": 4}, r"steps\.s\.inner: expected a block of settings \(depth, name\), got 4"),
    ({"scale": {"a": 1}}, r"steps\.s\.scale: expected a value, got a block"),
    ({"amount": "two"}, r"steps\.s\.amount: "),
    ({"amount": -1}, r"steps\.s\.amount: must be >= 0"),  # the kind's check sees the merged block
])
def test_a_bad_override_names_the_step_and_the_key(block, message):
  config = _config("s", {"s": {"type": "scaled", **block}})
  with pytest.raises(ConfigError, match=f"^config field {message}"):
    parse_steps(config, _kinds_with_defaults())


def test_apply_overrides_changes_only_the_given_keys():
  merged = apply_overrides(_scaled_defaults(), {"inner": {"name": "y"}}, "steps.s", "'s'")
  assert merged.to_dict() == {"amount": 1, "scale": 2.0, "inner": {"depth": 3, "name": "y"}}

"""Command-line overrides of step settings (sfjax/automl/pipeline/step_flags.py)."""

import ml_collections
import pytest

from sfjax.automl.pipeline import PipelineConfigError, StepKind, StepOutput, parse_steps
from sfjax.automl.pipeline.step_flags import _parse_value, set_step_flags, take_step_flags


def _defaults():
  return ml_collections.ConfigDict({"amount": 1, "scale": 2.0, "name": "x", "on": True,
                                    "dims": (4, 4), "inner": {"depth": 3}})


KINDS = {"scaled": StepKind(lambda ctx: StepOutput({}, {}), defaults=_defaults),
         "plain": StepKind(lambda ctx: StepOutput({}, {}))}


def _config():
  c = ml_collections.ConfigDict({"pipeline": {"order": "s"}, "steps": {
      "s": {"type": "scaled", "amount": 5}, "p": {"type": "plain", "width": 8}}})
  c.lock()
  return c


def test_take_step_flags_splits_them_out_of_argv():
  argv = ["prog", "--config=x.py", "--config.steps.s.amount=3", "--config.seed=1",
          "--config.steps.s.name", "y", "--noconfig.steps.s.on", "--config.steps.s.inner.depth=4",
          "--workdir=/w"]
  rest, taken = take_step_flags(argv)
  assert rest == ["prog", "--config=x.py", "--config.seed=1", "--workdir=/w"]
  assert taken == [("s.amount", "3"), ("s.name", "y"), ("s.on", "false"), ("s.inner.depth", "4")]


@pytest.mark.parametrize("text, like, want", [
    ("3", 1, 3), ("3", 1.0, 3.0), ("true", False, True), ("0", True, False), ("ab", "x", "ab"),
    ("(8, 4)", (1,), (8, 4)), ("8", (1,), (8,)), ("[1, 2]", None, [1, 2]), ("dask", None, "dask"),
])
def test_parse_value_takes_the_type_of_the_default(text, like, want):
  got = _parse_value(text, like, "steps.s.k")
  assert got == want and type(got) is type(want)


@pytest.mark.parametrize("text, like", [("x", 1), ("1.5", 2), ("maybe", True), ("(", (1,))])
def test_a_value_of_the_wrong_type_names_the_field(text, like):
  with pytest.raises(PipelineConfigError, match=r"^config field steps\.s\.k: expected "):
    _parse_value(text, like, "steps.s.k")


def test_flags_set_settings_the_block_lacks_typed_like_the_kinds_defaults():
  config = _config()
  _, taken = take_step_flags(["--config.steps.s.scale=3", "--config.steps.s.inner.depth=7",
                              "--config.steps.s.dims=(2, 2)", "--config.steps.p.width=16"])
  with config.unlocked():
    set_step_flags(config, taken, KINDS)
  assert config.steps.s.to_dict() == {"type": "scaled", "amount": 5, "scale": 3.0,
                                      "inner": {"depth": 7}, "dims": (2, 2)}
  assert config.steps.p.width == 16  # no defaults: typed like the block's own value
  (spec,) = parse_steps(config, KINDS)
  assert spec.block.inner.depth == 7 and spec.block.name == "x"


def test_a_misspelt_flag_is_refused_by_the_engine_naming_the_closest_key():
  config = _config()
  with config.unlocked():
    set_step_flags(config, [("s.amout", "3")], KINDS)
  with pytest.raises(PipelineConfigError, match=r"steps\.s\.amout: unknown setting of step 's' "
                                                r"\(scaled\); did you mean steps\.s\.amount\?"):
    parse_steps(config, KINDS)


@pytest.mark.parametrize("flag, message", [
    (("q.amount", "1"), r"steps\.q: missing \(a flag sets steps\.q\.amount; known blocks: p, s\)"),
    (("s", "1"), r"steps\.s: a flag sets one setting of a step"),
    (("s.amount", "many"), r"steps\.s\.amount: expected int, got 'many'"),
])
def test_bad_flags_name_the_field(flag, message):
  config = _config()
  with config.unlocked(), pytest.raises(PipelineConfigError, match=f"^config field {message}"):
    set_step_flags(config, [flag], KINDS)

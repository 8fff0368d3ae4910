"""Tests for conditions and forbidden clauses (sfjax/automl/space/conditions.py)."""

import json

import pytest

from sfjax.automl.space import Condition, Forbidden, SpaceError
from sfjax.automl.space.conditions import join_key


@pytest.mark.parametrize("build, fragment", [
    (lambda: Condition("a", "b", "eq", (1, 2)), "takes one value"),
    (lambda: Condition("a", "b", "gt", 1), "not one of"),
    (lambda: Condition("a", "b", "ne", []), "'ne' takes one value"),
    (lambda: Condition("a", "b", "in", []), "'in' needs at least one value"),
    (lambda: Forbidden({}), "at least one key == value pair"),
])
def test_bad_definitions_are_rejected(build, fragment):
  with pytest.raises(SpaceError, match=fragment):
    build()


def test_condition_errors_name_the_child():
  with pytest.raises(SpaceError, match="condition on 'model.mlp.depth': op 'gt'"):
    Condition("model.mlp.depth", "model.name", "gt", 1)


@pytest.mark.parametrize("op, values, holds_for, fails_for", [
    ("eq", "deepfm", ["deepfm"], ["fm", "dcnv2"]),
    ("eq", ("deepfm",), ["deepfm"], ["fm"]),
    ("ne", "adam", ["sgd", "momentum"], ["adam"]),
    ("in", ("deepfm", "dcnv2"), ["deepfm", "dcnv2"], ["fm", "lr"]),
    ("in", ["deepfm"], ["deepfm"], ["dcnv2"]),
    ("eq", 1, [1, 1.0], [True, 2, "1"]),  # bool is not an int here
    ("eq", True, [True], [1, 1.0, False]),
    ("ne", 0.0, [0.5, False], [0, 0.0]),
])
def test_condition_holds(op, values, holds_for, fails_for):
  condition = Condition("child", "parent", op, values)
  assert isinstance(condition.values, tuple)
  for v in holds_for:
    assert condition.holds(v), v
  for v in fails_for:
    assert not condition.holds(v), v


def test_condition_renamed_and_to_dict():
  condition = Condition("depth", "name", "in", ["deepfm", "dcnv2"])
  assert condition.values == ("deepfm", "dcnv2")
  assert condition.renamed("model") == Condition("model.depth", "model.name", "in",
                                                 ("deepfm", "dcnv2"))
  assert condition.renamed("") == condition
  data = json.loads(json.dumps(condition.to_dict()))
  assert data == {"child": "depth", "parent": "name", "op": "in", "values": ["deepfm", "dcnv2"]}
  assert Condition(**data) == condition and hash(Condition(**data)) == hash(condition)
  assert Condition("a", "b", "eq", 3).to_dict()["values"] == [3]


def test_forbidden_clause_with_inactive_key_never_holds():
  clause = Forbidden({"a": 1, "b": 2})
  assert not clause.holds({"a": 1})
  assert clause.holds({"a": 1, "b": 2, "c": 0})


def test_forbidden_clause_values_renamed_and_to_dict():
  clause = Forbidden({"name": "dcnv2", "mlp.depth": 3})
  assert clause.holds({"name": "dcnv2", "mlp.depth": 3.0})
  assert not clause.holds({"name": "dcnv2", "mlp.depth": 2})
  assert not Forbidden({"flag": True}).holds({"flag": 1})
  assert clause.renamed("model") == Forbidden({"model.name": "dcnv2", "model.mlp.depth": 3})
  assert Forbidden(clause.to_dict()) == clause and hash(Forbidden(clause.to_dict())) == hash(clause)
  assert Forbidden([("name", "dcnv2"), ("mlp.depth", 3)]) == clause  # pairs accepted
  assert repr(clause) == "Forbidden({'name': 'dcnv2', 'mlp.depth': 3})"


def test_join_key():
  assert join_key("model.mlp", "width") == "model.mlp.width"
  assert join_key("", "width") == "width"

"""Tests for sfjax/core/names.py: one lookup, one error naming the field and the known names."""

import pytest

from sfjax.core import names
from sfjax.core.errors import ConfigError


def test_lookup_returns_the_entry():
  assert names.lookup({"a": 1, "b": 2}, "b", "x.y", "thing") == 2


def test_unknown_name_names_field_value_and_known_names():
  with pytest.raises(ConfigError) as info:
    names.lookup({"sgd": 0, "adam": 1}, "lamb", "optimizer.name", "dense optimizer")
  assert str(info.value) == ("config field optimizer.name: unknown dense optimizer 'lamb' "
                             "(known: sgd, adam)")
  assert isinstance(info.value, ValueError)

"""`named_entries`: the `name:rest` lists of config strings (data.pooling, data.tables, ...)."""

import pytest

from sfjax.core import ConfigError, named_entries


def test_entries_in_order_stripped_blanks_skipped():
  got = named_entries(" a:1 ,, b : x:y ,", "f", form="n:v", kind="thing")
  assert got == [("a", "1"), ("b", "x:y")]  # the rest keeps its own colons
  assert named_entries("", "f", form="n:v", kind="thing") == []
  assert named_entries("a:1,2; b:3", "f", form="n:v", kind="t", separator=";") == [
      ("a", "1,2"), ("b", "3")]


@pytest.mark.parametrize("text, match", [
    ("a", "config field f: entry 'a' is not 'n:v'"),
    ("a:", "config field f: entry 'a:' is not 'n:v'"),
    (":1", "config field f: entry ':1' is not 'n:v'"),
    ("a:1,a:2", "config field f: thing 'a' is named twice"),
])
def test_bad_entries_name_the_field(text, match):
  with pytest.raises(ConfigError, match=match):
    named_entries(text, "f", form="n:v", kind="thing")

"""Errors name the bad place."""

import pytest

from sfjax.core import errors


def test_data_format_error_names_path_and_line():
  err = errors.DataFormatError("data/train.tsv", 17, "expected 40 columns, got 39")
  assert str(err) == "data/train.tsv:17: expected 40 columns, got 39"
  assert (err.path, err.line, err.reason) == ("data/train.tsv", 17, "expected 40 columns, got 39")
  assert isinstance(err, ValueError)
  with pytest.raises(ValueError, match=r"train\.tsv:17:"):
    raise err


def test_config_error_is_a_value_error():
  err = errors.ConfigError("train.batch_size: must be > 0")
  assert isinstance(err, ValueError) and str(err) == "train.batch_size: must be > 0"
  with pytest.raises(ValueError, match="train.batch_size"):
    raise err

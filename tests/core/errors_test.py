"""Errors name the bad place; one `ConfigError` base for every config error."""

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


def test_closest_name_suggests_only_near_misses():
  known = ["num_trials", "cohort_width", "max_budget", "min_budget"]
  assert errors.closest_name("num_trial", known) == "num_trials"
  assert errors.closest_name("max_budgte", known) == "max_budget"
  assert errors.closest_name("zzz", known) is None


def test_unknown_key_error_names_the_field_the_guess_and_the_known_keys():
  err = errors.unknown_key_error("steps.nas.study", "num_trial", ["num_trials", "algorithm"],
                                 "setting")
  assert isinstance(err, errors.ConfigError)
  assert str(err) == ("config field steps.nas.study.num_trial: unknown setting; did you mean "
                      "steps.nas.study.num_trials? (known: algorithm, num_trials)")
  top = errors.unknown_key_error("", "sed", ["seed"])
  assert str(top) == "config field sed: unknown key; did you mean seed? (known: seed)"
  far = errors.unknown_key_error("study", "xyz", ["eta"])
  assert "did you mean" not in str(far) and "(known: eta)" in str(far)


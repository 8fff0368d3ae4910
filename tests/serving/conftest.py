"""Shared fixtures of the serving tests: a feature-layout run and its bundle, trained once."""

from typing import NamedTuple

import pytest

from sfjax.serving import write_bundle
from tests.serving import tiny_runs


class LayoutServed(NamedTuple):
  """A feature-layout run, its bundle, and its eval split as the trainer scored it."""

  run: tiny_runs.Run
  bundle: str
  logits: object  # [n]
  ids: object  # [n, S], -1 padding
  dense: object  # [n, Nd]
  labels: object  # [n]
  weights: object  # [n, S]


def _served(root, model: str) -> LayoutServed:
  run = tiny_runs.train_run(root, tiny_runs.layout_config(model))
  bundle = str(root / "bundle")
  write_bundle(run.workdir, bundle)
  return LayoutServed(run, bundle, *tiny_runs.trainer_layout_logits(run))


@pytest.fixture(scope="session")
def layout_deepfm(tmp_path_factory) -> LayoutServed:
  """A DeepFM trained 4 steps on `ctr.py:multihot_smoke` (bags, a weighted bag, a history
  sharing the item table), exported."""
  return _served(tmp_path_factory.mktemp("layout_deepfm"), "deepfm")


@pytest.fixture(scope="session")
def layout_din(tmp_path_factory) -> LayoutServed:
  """DIN (target attention over the history) on the same data, exported."""
  return _served(tmp_path_factory.mktemp("layout_din"), "din")

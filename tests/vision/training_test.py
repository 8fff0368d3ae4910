"""The recipe: fit learns digits, is vmappable over hyperparameters, applies augmentation."""

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.vision import cnn, image_data, training


def test_fit_learns_and_vmaps_over_learning_rates():
  splits = image_data.load_splits("digits", max_train=600)
  params = cnn.init_cnn(jax.random.key(0), (8, 16, 16))
  train = jax.jit(jax.vmap(lambda lr: training.fit(cnn.apply_cnn, params, splits.train_x,
                                                   splits.train_y, 60, 32, lr, 1e-4,
                                                   jax.random.key(1))))
  trained, losses = train(jnp.array([0.0, 1e-2]))
  assert losses.shape == (2, 60)
  np.testing.assert_allclose(trained["dense2"]["b"][0], params["dense2"]["b"])  # lr 0: unchanged
  acc = training.accuracy(cnn.apply_cnn, jax.tree.map(lambda a: a[1], trained), splits.valid_x,
                          splits.valid_y)
  assert acc > 0.3  # chance is 0.1


def test_augment_sees_every_batch_and_step():
  x = jnp.ones((5, 2, 2, 1))

  def augment(key, batch, step):
    return batch * 0.0  # all-zero images: the model only learns the label prior

  params = {"w": jnp.zeros((4, 3)), "b": jnp.zeros(3)}
  apply = lambda p, x: x.reshape(x.shape[0], -1) @ p["w"] + p["b"]
  trained, _ = training.fit(apply, params, x, jnp.array([0, 0, 1, 2, 0]), 5, 4, 0.1, 0.0,
                            jax.random.key(0), augment)
  np.testing.assert_allclose(trained["w"], 0.0)  # zero inputs: no weight gradient
  assert float(trained["b"][0]) > 0

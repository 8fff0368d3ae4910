"""The recipe: fit learns digits, is vmappable, applies augmentation; it runs the shared
dense step (jitted with the state donated, no recompile, 8 devices = 1), and batch-norm
statistics travel as non-parameter state."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax.train import step as step_lib
from sfjax.vision import cnn, image_data, training
from sfjax.vision import conv_layers as layers


@pytest.mark.slow  # ~10 s; the fast tier stays under 5 minutes (make test-all runs it)
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

  def apply(p, x):
    return x.reshape(x.shape[0], -1) @ p["w"] + p["b"]

  trained, _ = training.fit(apply, params, x, jnp.array([0, 0, 1, 2, 0]), 5, 4, 0.1, 0.0,
                            jax.random.key(0), augment)
  np.testing.assert_allclose(trained["w"], 0.0)  # zero inputs: no weight gradient
  assert float(trained["b"][0]) > 0


def _linear(p, x):
  return x.reshape(x.shape[0], -1) @ p["w"] + p["b"]


def _tiny_problem(n=16):
  k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
  images = jax.random.uniform(k1, (n, 2, 2, 1))
  labels = jax.random.randint(k2, (n,), 0, 3)
  params = {"w": jax.random.normal(k3, (4, 3)) * 0.1, "b": jnp.zeros(3)}
  return images, labels, params


def test_jitted_donated_step_equals_the_scanned_training_without_recompiling():
  images, labels, params = _tiny_problem()
  key, loss_fn = jax.random.key(7), training.classifier_loss(_linear)
  scanned, losses = jax.jit(lambda s: training.train_steps(loss_fn, s, images, labels, 3, 8, key))(
      training.init_dense_state(params, 0.1, 1e-2))
  step = step_lib.jit_train_step(chex.assert_max_traces(training._make_train_step(loss_fn), n=1))
  state = training.init_dense_state(params, 0.1, 1e-2)
  for i in range(3):
    old = state
    state, metrics = step(state, training._draw_batch(key, images, labels, 8, i))
    assert old.params["w"].is_deleted()  # donated: the step reuses the state's buffers
    np.testing.assert_allclose(metrics["loss"], losses[i], rtol=1e-6)
  assert int(state.step) == int(scanned.step) == 3
  chex.assert_trees_all_close(state.params, scanned.params, rtol=1e-6)
  chex.assert_trees_all_close(state.opt_state, scanned.opt_state, rtol=1e-6)


def test_step_on_eight_devices_equals_one_device():
  images, labels, params = _tiny_problem()
  step_fn = training._make_train_step(training.classifier_loss(_linear))
  batch = training._draw_batch(jax.random.key(1), images, labels, 16, 0)
  one, one_metrics = jax.jit(step_fn)(training.init_dense_state(params, 0.1, 1e-2), batch)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  state = jax.device_put(training.init_dense_state(params, 0.1, 1e-2), replicated)
  batch8 = jax.device_put(batch, sharded)
  assert len(batch8[0].sharding.device_set) == 8
  eight, metrics = step_lib.jit_train_step(step_fn, replicated, sharded)(state, batch8)
  chex.assert_trees_all_close(eight.params, one.params, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["loss"], one_metrics["loss"], rtol=1e-6)


def _bn_init(key):
  conv = layers.conv_init(key, 1, 3)
  bn, stats = layers.batch_norm_init(3)
  head = layers.dense_init(jax.random.fold_in(key, 1), 3, 2)
  return {"conv": conv, "bn": bn, "head": head}, stats


def _bn_apply(p, stats, x, train):
  h = layers.conv2d(x, p["conv"]["w"]) + p["conv"]["b"]  # [B, H, W, 3]
  h, stats = layers.batch_norm(p["bn"], stats, h, train)
  h = jax.nn.relu(h).mean(axis=(1, 2))
  return h @ p["head"]["w"] + p["head"]["b"], stats


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_batch_norm_statistics_travel_as_model_state_not_parameters():
  images = jax.random.uniform(jax.random.key(0), (32, 4, 4, 1)) + 2.0
  labels = (images.mean(axis=(1, 2, 3)) > 2.5).astype(jnp.int32)
  params, stats = _bn_init(jax.random.key(1))
  key, loss_fn = jax.random.key(2), training._stateful_classifier_loss(_bn_apply)
  # A large weight decay: had the statistics been parameters, AdamW would move them too.
  state = training.init_dense_state(params, 0.05, 0.5, stats)
  one, _ = jax.jit(training._make_train_step(loss_fn))(
      state, training._draw_batch(key, images, labels, 16, 0))
  x, _ = training._draw_batch(key, images, labels, 16, 0)
  h = layers.conv2d(x, params["conv"]["w"]) + params["conv"]["b"]
  np.testing.assert_allclose(one.model_state["mean"], 0.1 * h.mean(axis=(0, 1, 2)), rtol=1e-5)
  n = h.size // 3
  np.testing.assert_allclose(one.model_state["var"],
                             0.9 + 0.1 * h.var(axis=(0, 1, 2)) * n / (n - 1), rtol=1e-5)
  assert set(one.params) == {"conv", "bn", "head"}  # the statistics are not in the parameters
  assert not np.allclose(one.params["bn"]["scale"], 1.0)  # the parameters did move
  trained, losses = jax.jit(lambda s: training.train_steps(loss_fn, s, images, labels, 100, 16,
                                                           key))(
      training.init_dense_state(params, 0.02, 1e-4, stats))
  assert int(trained.step) == 100 and float(losses[-10:].mean()) < float(losses[:10].mean())
  # Learning rate 0: the parameters stay, the statistics still move, to the features' mean.
  frozen = trained._replace(opt_state=training.init_dense_state(trained.params, 0.0, 0.0).opt_state)
  frozen, _ = jax.jit(lambda s: training.train_steps(loss_fn, s, images, labels, 60, 16, key))(
      frozen)
  chex.assert_trees_all_equal(frozen.params, trained.params)
  h_all = layers.conv2d(images, trained.params["conv"]["w"]) + trained.params["conv"]["b"]
  np.testing.assert_allclose(frozen.model_state["mean"], h_all.mean(axis=(0, 1, 2)), rtol=0.05)
  # Eval mode reads the running statistics.

  def eval_apply(p, x):
    return _bn_apply(p, frozen.model_state, x, False)[0]

  assert float(training.accuracy(eval_apply, frozen.params, images, labels)) > 0.8

"""Dense-parameter optimizers (optax): the one factory of the trainer and the AutoML trials.

    tx = dense_optimizer("adam", learning_rate=1e-3, weight_decay=1e-4)
    tx = from_config(config.optimizer)       # the `optimizer` block of a CTR config

Every optimizer applies `weight_decay`:

  adam     L2 added to the gradient before Adam (`add_decayed_weights`, then `adam`)
  adamw    decoupled weight decay (Loshchilov & Hutter 2019; `optax.adamw`)
  sgd      L2 added to the gradient, then SGD
  adagrad  L2 added to the gradient, then Adagrad

Both hyperparameters are injected (`optax.inject_hyperparams`): they live in the
optimizer state as arrays, so they can be traced, vmapped over trials and
rewritten between PBT rounds, and the state's structure does not depend on
their values (weight decay 0 adds exactly 0).
"""

from __future__ import annotations

from collections.abc import Callable

import optax

from sfjax.core import names


def _with_l2(inner: Callable[[float], optax.GradientTransformation]):
  return lambda learning_rate, weight_decay: optax.chain(
      optax.add_decayed_weights(weight_decay), inner(learning_rate))


# name -> (learning_rate, weight_decay) -> transformation. The registry every name list derives from.
DENSE_OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "adam": _with_l2(optax.adam),
    "adamw": lambda learning_rate, weight_decay: optax.adamw(learning_rate,
                                                             weight_decay=weight_decay),
    "sgd": _with_l2(optax.sgd),
    "adagrad": _with_l2(optax.adagrad),
}
DENSE_OPTIMIZER_NAMES: tuple[str, ...] = tuple(DENSE_OPTIMIZERS)


def dense_optimizer(name: str, learning_rate, weight_decay=0.0,
                    field: str = "optimizer.name") -> optax.GradientTransformation:
  """optax optimizer `name` with injected (traceable) `learning_rate` and `weight_decay`.

  Args:
    name: one of `DENSE_OPTIMIZER_NAMES`.
    learning_rate, weight_decay: floats or traced scalars.
    field: the config field named in the error for an unknown `name`.

  Raises:
    ConfigError: an unknown name (the message names `field`).
  """
  factory = names.lookup(DENSE_OPTIMIZERS, name, field, "dense optimizer")
  return optax.inject_hyperparams(factory)(
      learning_rate=learning_rate, weight_decay=weight_decay)


def from_config(cfg) -> optax.GradientTransformation:
  """The optimizer of an `optimizer` config block (`name`, `learning_rate`, `weight_decay`)."""
  return dense_optimizer(cfg.name, cfg.learning_rate, cfg.weight_decay)

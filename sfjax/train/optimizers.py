"""Dense-parameter optimizers (optax): the one factory of the trainer and the AutoML trials.

    tx = dense_optimizer("adam", learning_rate=1e-3, weight_decay=1e-4)
    tx = from_config(config.optimizer)       # the `optimizer` block of a CTR config

Every optimizer applies `weight_decay`:

  adam     L2 added to the gradient before Adam (`add_decayed_weights`, then `adam`)
  adamw    decoupled weight decay (Loshchilov & Hutter 2019; `optax.adamw`)
  sgd      L2 added to the gradient, then SGD
  adagrad  L2 added to the gradient, then Adagrad
  grda     L2 added to the gradient, then gRDA (`sfjax.train.grda`: exact zeros; its
           static options `c`, `mu`; AutoFIS trains its gates with it)

Both hyperparameters are injected (`optax.inject_hyperparams`): they live in the
optimizer state as arrays, so they can be traced, vmapped over trials and
rewritten between PBT rounds, and the state's structure does not depend on
their values (weight decay 0 adds exactly 0).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import optax

from sfjax.core import names
from sfjax.core.errors import ConfigError
from sfjax.train import grda as grda_lib


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
    "grda": lambda learning_rate, weight_decay, c=grda_lib.DEFAULT_C, mu=grda_lib.DEFAULT_MU: (
        optax.chain(optax.add_decayed_weights(weight_decay),
                    grda_lib.grda(learning_rate, c, mu))),
}
DENSE_OPTIMIZER_NAMES: tuple[str, ...] = tuple(DENSE_OPTIMIZERS)


def dense_optimizer(name: str, learning_rate, weight_decay=0.0, field: str = "optimizer.name",
                    **options) -> optax.GradientTransformation:
  """optax optimizer `name` with injected (traceable) `learning_rate` and `weight_decay`.

  Args:
    name: one of `DENSE_OPTIMIZER_NAMES`.
    learning_rate, weight_decay: floats or traced scalars.
    field: the config field named in the error for an unknown `name`.
    **options: the optimizer's own static settings (Python values, not injected):
      `c` and `mu` of 'grda'.

  Raises:
    ConfigError: an unknown name, or an option the optimizer does not take (the
      message names `field`).
  """
  factory = names.lookup(DENSE_OPTIMIZERS, name, field, "dense optimizer")
  known = set(inspect.signature(factory).parameters) - {"learning_rate", "weight_decay"}
  unknown = sorted(set(options) - known)
  if unknown:
    raise ConfigError(f"config field {field}: dense optimizer {name!r} takes no option "
                      f"{unknown[0]!r} (its options: {sorted(known) or 'none'})")
  return optax.inject_hyperparams(factory, static_args=tuple(sorted(known)))(
      learning_rate=learning_rate, weight_decay=weight_decay, **options)


def dense_optimizer_from_config(cfg) -> optax.GradientTransformation:
  """The optimizer of an `optimizer` config block (`name`, `learning_rate`, `weight_decay`)."""
  return dense_optimizer(cfg.name, cfg.learning_rate, cfg.weight_decay)

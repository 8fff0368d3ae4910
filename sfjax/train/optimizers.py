"""Dense-parameter optimizers (optax) from the `optimizer` config block."""

from __future__ import annotations

import optax

DENSE_OPTIMIZERS = ("adam", "adamw", "sgd", "adagrad")


def dense_optimizer(cfg) -> optax.GradientTransformation:
  """optax transformation named by `cfg.name` with `cfg.learning_rate`, `cfg.weight_decay`.

  The learning rate (and weight decay) are injected hyperparameters, i.e. optimizer
  state, so they can be traced and vmapped over trials.
  """
  name, lr, wd = cfg.name, cfg.learning_rate, cfg.weight_decay
  if name == "adam":
    if wd:
      return optax.inject_hyperparams(
          lambda learning_rate, weight_decay: optax.chain(
              optax.add_decayed_weights(weight_decay), optax.adam(learning_rate)))(
                  learning_rate=lr, weight_decay=wd)
    return optax.inject_hyperparams(optax.adam)(learning_rate=lr)
  if name == "adamw":
    return optax.inject_hyperparams(optax.adamw)(learning_rate=lr, weight_decay=wd)
  if name == "sgd":
    return optax.inject_hyperparams(optax.sgd)(learning_rate=lr)
  if name == "adagrad":
    return optax.inject_hyperparams(optax.adagrad)(learning_rate=lr)
  raise ValueError(f"config field optimizer.name: unknown dense optimizer {name!r} "
                   f"(known: {', '.join(DENSE_OPTIMIZERS)})")

"""The training run the backend equality tests compare (device, cache, row-sharded, 8 devices):
final metrics, final state, the trainer (its backend's host table) and every step's loss."""

from typing import Any, NamedTuple

import numpy as np

from sfjax.data import dataset as dataset_lib
from sfjax.train import loop


class Run(NamedTuple):
  final: dict
  state: Any
  trainer: loop.Trainer
  losses: np.ndarray


def train_run(config, data=None) -> Run:
  """Trains `config` on `data` (default: the data set its config names) and keeps the trainer
  and every step's loss."""
  data = data or dataset_lib.make_dataset(config.data, config.seed)
  trainer = loop.build_trainer(config, data.spec)
  losses: list = []
  final, state = loop.train_and_evaluate(config, dataset=data, trainer=trainer, loss_log=losses)
  return Run(final, state, trainer, np.asarray(losses))

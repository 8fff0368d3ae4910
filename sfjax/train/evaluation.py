"""Evaluation of a trained state: exact AUC and logloss over every real example of a split."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from sfjax.core import background
from sfjax.core import metrics as metrics_lib
from sfjax.parallel import distributed
from sfjax.train import backends
from sfjax.train.state import TrainState


def evaluate(backend: backends.Backend, state: TrainState, dataset, split: str,
             batch_size: int) -> dict[str, Any]:
  """Exact AUC and logloss of `state` over every real example of `split`.

  The backend is synced first (the cache flushes to the host table), eval
  batches are prepared on a background thread while the device scores. Over several
  processes each keeps the scores of its own examples (`distributed.process_rows`);
  the scores, labels and masks of all processes are gathered before the exact metrics,
  so every process returns the same numbers.

  Raises:
    ValueError: the split has no batch.
  """
  backend.sync(state)
  logits, labels, masks = [], [], []
  with background.map_in_background(lambda b: (backend.prepare_eval(b), b),
                                    dataset.eval_batches(split, batch_size),
                                    maxsize=2, name="sfjax-eval") as it:
    for prepared, batch in it:
      logits.append(_local_scores(backend.eval_logits(state, prepared)))
      own = distributed.process_rows(batch.size)
      labels.append(batch.labels[own])
      masks.append(batch.mask[own])
  if not logits:
    raise ValueError(f"eval split {split!r} is empty")
  scores = distributed.allgather_rows(np.concatenate(logits))
  all_labels = distributed.allgather_rows(np.concatenate(labels))
  all_masks = distributed.allgather_rows(np.concatenate(masks))
  probs = metrics_lib.sigmoid(scores)
  return {"auc": metrics_lib.auc(all_labels, scores, all_masks),
          "logloss": metrics_lib.logloss(all_labels, probs, all_masks),
          "num_examples": int(all_masks.sum())}


def _local_scores(logits) -> np.ndarray:
  """This process's rows of a batch's logits [B] (all of them on one process)."""
  if isinstance(logits, jax.Array):
    return distributed.local_rows(logits)
  return np.asarray(logits)


def evaluate_splits(backend: backends.Backend, state: TrainState, dataset,
                    batch_size: int) -> dict[str, float]:
  """`<split>_auc` / `<split>_logloss` of every eval split; `auc` / `logloss` of the first.

  The first split is the one model selection uses (e.g. 'eval' or 'valid').
  """
  record: dict[str, float] = {}
  for i, split in enumerate(dataset.eval_splits):
    m = evaluate(backend, state, dataset, split, batch_size)
    record[f"{split}_auc"], record[f"{split}_logloss"] = m["auc"], m["logloss"]
    if i == 0:
      record["auc"], record["logloss"] = m["auc"], m["logloss"]
  return record

"""Fixed-shape batches from streams of variable-size chunks (host-side numpy).

* Training: `train_batches` repeats epochs forever, mixes each through a
  seeded streaming shuffle buffer and yields only full batches (mask all ones);
  batches may straddle epoch boundaries.
* Evaluation: `eval_batches` is finite and keeps every example; the last
  partial batch is padded (ids 0, dense 0, labels 0) with mask 0.

Every yielded array is freshly allocated and never written again: a consumer
may hand it to `jax.device_put`, which can alias numpy buffers on CPU
(DESIGN.md section 7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np

from sfjax.data.types import Batch, concat_batches, map_arrays


def take(batch: Batch, index: np.ndarray | slice) -> Batch:
  """The examples `index` (a slice, positions or a boolean mask) of `batch`."""
  if isinstance(index, np.ndarray) and index.dtype != bool:
    # np.take gathers rows ~3x faster than fancy indexing (the shuffle buffer's hot path).
    return map_arrays(lambda a: np.take(a, index, axis=0), batch)
  return map_arrays(lambda a: a[index], batch)


def _pad_batch(batch: Batch, batch_size: int) -> Batch:
  """Pads `batch` to `batch_size` examples with ids 0, dense 0, labels 0, mask 0."""
  extra = batch_size - batch.size
  if extra < 0:
    raise ValueError(f"batch of {batch.size} examples exceeds batch_size {batch_size}")
  return map_arrays(lambda a: np.concatenate([a, np.zeros((extra,) + a.shape[1:], a.dtype)]),
                    batch)


def rebatch(chunks: Iterable[Batch], batch_size: int, pad_last: bool) -> Iterator[Batch]:
  """Cuts a stream of chunks into batches of exactly `batch_size` examples.

  Args:
    chunks: batches of any sizes (including 0), all with the same field layout.
    batch_size: examples per output batch.
    pad_last: pad a final partial batch (mask 0) instead of dropping it.

  Yields:
    Batches with ids [B, F], dense [B, Nd], labels [B], mask [B], B = batch_size.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  pending: list[Batch] = []
  count = 0
  for chunk in chunks:
    if chunk.size == 0:
      continue
    pending.append(chunk)
    count += chunk.size
    if count < batch_size:
      continue
    merged = concat_batches(pending)  # A copy: slices below never alias inputs.
    full = count // batch_size
    for i in range(full):
      yield take(merged, slice(i * batch_size, (i + 1) * batch_size))
    count -= full * batch_size
    pending = [take(merged, slice(full * batch_size, None))] if count else []
  if pad_last and count:
    yield _pad_batch(concat_batches(pending), batch_size)


def _shuffle_stream(chunks: Iterable[Batch], buffer_size: int,
                    rng: np.random.Generator) -> Iterator[Batch]:
  """Streaming shuffle: emits examples drawn at random from a bounded buffer.

  The buffer first fills to `buffer_size` examples; then each incoming chunk
  of k examples swaps with k uniformly chosen buffered ones, which are emitted.
  At the end of a finite stream the remaining buffer is emitted in random
  order. Memory is O(buffer_size) examples; `buffer_size <= 1` disables it.

  Args:
    chunks: input batches (any sizes).
    buffer_size: examples held back for mixing.
    rng: the source of randomness (its state advances).

  Yields:
    Batches of varying sizes holding every input example exactly once.
  """
  if buffer_size <= 1:
    yield from chunks
    return
  pending: list[Batch] = []
  pending_size = 0
  buffer: Batch | None = None  # Exactly `buffer_size` examples once full.
  for chunk in chunks:
    if chunk.size == 0:
      continue
    if buffer is None or chunk.size >= buffer_size:
      pending.append(chunk)
      pending_size += chunk.size
      if buffer is not None:
        pending.append(buffer)
        pending_size += buffer_size
        buffer = None
      if pending_size < buffer_size:
        continue
      union = concat_batches(pending)
      order = rng.permutation(pending_size)
      excess = pending_size - buffer_size
      if excess:
        yield take(union, order[:excess])
      buffer = take(union, order[excess:])
      pending, pending_size = [], 0
      continue
    slots = rng.choice(buffer_size, size=chunk.size, replace=False)
    out = take(buffer, slots)  # Fancy indexing copies: safe to hand out.
    for dst, src in zip(buffer, chunk, strict=True):
      if dst is not None:  # weights are absent (None) without a feature layout
        dst[slots] = src
    yield out
  leftover = pending + ([buffer] if buffer is not None else [])
  if leftover:
    rest = concat_batches(leftover)
    yield take(rest, rng.permutation(rest.size))


def _shuffled_epochs(make_epoch: Callable[[], Iterable[Batch]], buffer_size: int,
                     rng: np.random.Generator) -> Iterator[Batch]:
  """Epochs forever, each shuffled by its own `_shuffle_stream` pass.

  The buffer is flushed at the end of each epoch, so every epoch yields each
  example exactly once and a buffer larger than the data set costs no extra
  passes over the files.

  Raises:
    ValueError: an epoch has no examples (instead of looping forever).
  """
  epoch = 0
  while True:
    examples = 0
    for chunk in _shuffle_stream(make_epoch(), buffer_size, rng):
      examples += chunk.size
      yield chunk
    if examples == 0:
      raise ValueError(f"training data has no examples (epoch {epoch} was empty)")
    epoch += 1


def train_batches(make_epoch: Callable[[], Iterable[Batch]], batch_size: int,
                  shuffle_buffer: int, seed: int) -> Iterator[Batch]:
  """Infinite training batches: repeated, shuffled epochs cut into full batches.

  Args:
    make_epoch: returns a fresh iterable over one epoch's chunks.
    batch_size: B.
    shuffle_buffer: examples in the shuffle buffer (<= 1: keep the order).
    seed: seeds the shuffle.

  Yields:
    Batches of exactly B examples, mask all ones (they may straddle epochs).
  """
  rng = np.random.default_rng(seed)
  return rebatch(_shuffled_epochs(make_epoch, shuffle_buffer, rng), batch_size, pad_last=False)


def eval_batches(chunks: Iterable[Batch], batch_size: int) -> Iterator[Batch]:
  """Finite eval batches in input order; the last one padded with mask 0."""
  return rebatch(chunks, batch_size, pad_last=True)

"""The chunk plan of a cohort run: which trials share which program call, and how wide.

DESIGN.md §4. `CohortRunner.run` groups its trials (`_group_trials`), cuts each group
into chunks of its cohort width and runs every chunk as one call of one compiled
program. `plan_chunks` is that split as data, one `Chunk` per call: its trials, the
group's width, the lanes the call runs (power-of-two padding), its shape bucket,
whether it is a masked (padded) program, and each trial's step range. The runner
executes exactly the plan and tags every result with its chunk, so what a search
reports (`program_summary`: `mean_cohort_width`, `lane_utilization`) is computed
from the chunks that ran, never re-derived beside them.

Rules:
  * Grouping: by default one group per (bucket, step range, resume); a ragged run
    groups by bucket alone, longest range first (`_group_trials`).
  * Chunking: a group of n trials at width w runs chunks of w trials in group
    order, the last one partial.
  * Padding: a partial chunk of k trials runs at the smallest power of two >= k
    (at most w) lanes, the extra lanes copies of its first trial (results dropped),
    so a run compiles at most log2(w) extra programs per range length.
  * Steps: every lane runs the chunk's scan, as long as its longest range; a
    trial's steps past its own range are not applied (`Chunk.lane_steps`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple


class Chunk(NamedTuple):
  """One program call of a cohort run.

  Attributes:
    trials: indices of its real trials in the run's input order (a ragged chunk
      lists them longest range first).
    width: the cohort width its group was cut at (fixed, or measured for 'auto').
    lanes: W, the trial axis of the call: the smallest power of two >= its trials,
      at most `width`.
    key: the trials' shape bucket (`buckets.bucket_key`, or any hashable).
    masked: its trials' architectures differ: one padded program of the bucket's
      superset (`sfjax.cohorts.shape_buckets.buckets`).
    starts, ends: per real trial, its global step range `[start, end)`.
    resumes: per real trial, whether it resumes from a given state.
  """

  trials: tuple[int, ...]
  width: int
  lanes: int
  key: Hashable
  masked: bool
  starts: tuple[int, ...]
  ends: tuple[int, ...]
  resumes: tuple[bool, ...]

  @property
  def lane_trials(self) -> tuple[int, ...]:
    """[W] the trial each lane runs: the real trials, then copies of the first."""
    return self.trials + (self.trials[0],) * (self.lanes - len(self.trials))

  @property
  def ragged(self) -> bool:
    """Its trials differ in step range or resume: each lane takes its own range."""
    return len(set(zip(self.starts, self.ends, self.resumes, strict=True))) > 1

  @property
  def from_states(self) -> bool:
    """The call starts from given host states (resumed, ragged or masked trials);
    else the program draws fresh trials from their seeds."""
    return self.ragged or self.masked or self.resumes[0]

  @property
  def num_steps(self) -> int:
    """The call's scan length: its longest step range."""
    return max(e - s for s, e in zip(self.starts, self.ends, strict=True))

  @property
  def trial_steps(self) -> int:
    """Steps that train a real trial (the sum of their ranges)."""
    return sum(e - s for s, e in zip(self.starts, self.ends, strict=True))

  @property
  def lane_steps(self) -> int:
    """Trial-steps the call runs: every lane (padding included) over the whole scan."""
    return self.lanes * self.num_steps


def _group_trials(keys: Sequence[Hashable], start_steps: Sequence[int],
                  end_steps: Sequence[int], resumes: Sequence[bool],
                  ragged: bool) -> list[list[int]]:
  """How a cohort run groups trials into programs, before chunking by width.

  Args:
    keys: per trial, its shape bucket (`buckets.bucket_key`) or anything hashable.
    start_steps, end_steps, resumes: per trial, its step range and whether it resumes.
    ragged: trials of one bucket with different step ranges (or resumes) share a
      program (each takes its own range); else one group per (bucket, range, resume).

  Returns:
    Groups of trial indices, in order of first appearance. A ragged group lists its
    trials longest range first, so a chunk of the cohort width holds similar lengths.
  """
  groups: dict[Any, list[int]] = {}
  for i, key in enumerate(keys):
    group = key if ragged else (key, int(start_steps[i]), int(end_steps[i]), bool(resumes[i]))
    groups.setdefault(group, []).append(i)
  if not ragged:
    return list(groups.values())

  def longest_first(i: int) -> int:
    return int(start_steps[i]) - int(end_steps[i])

  return [sorted(members, key=longest_first) for members in groups.values()]


def _padded_width(size: int, width: int) -> int:
  """Lanes of a chunk of `size` trials at cohort width `width`: the smallest power of
  two >= `size`, at most `width`."""
  return min(width, 1 << max(size - 1, 0).bit_length())


def plan_chunks(keys: Sequence[Hashable], start_steps: Sequence[int], end_steps: Sequence[int],
                resumes: Sequence[bool], *, ragged: bool,
                width: int | Callable[[Sequence[int]], int],
                archs: Sequence[Hashable] | None = None) -> tuple[Chunk, ...]:
  """The program calls of a cohort run, in the order the runner makes them.

  Args:
    keys: per trial, its shape bucket.
    start_steps, end_steps: per trial, its global step range.
    resumes: per trial, whether it resumes from a given state.
    ragged: group by bucket alone (`_group_trials`).
    width: the cohort width, or a function of a group's trial indices returning it
      (the runner's 'auto' width, measured per architecture), called once per group.
    archs: per trial, its architecture (None: one per key); a chunk whose trials'
      architectures differ is `masked`.

  Returns:
    The chunks, group by group.

  Raises:
    ValueError: sequences of different lengths, an invalid step range, or a width
      that is not a positive integer.
  """
  n = len(keys)
  archs = keys if archs is None else archs
  for name, seq in (("start_steps", start_steps), ("end_steps", end_steps),
                    ("resumes", resumes), ("archs", archs)):
    if len(seq) != n:
      raise ValueError(f"plan_chunks: {name} has {len(seq)} entries but keys has {n}")
  starts, ends = [int(s) for s in start_steps], [int(e) for e in end_steps]
  for i in range(n):
    if not 0 <= starts[i] <= ends[i]:
      raise ValueError(f"plan_chunks: trial {i}: step range [{starts[i]}, {ends[i]}) is invalid")
  chunks = []
  for members in _group_trials(keys, starts, ends, resumes, ragged):
    w = width(members) if callable(width) else width
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
      raise ValueError(f"plan_chunks: the cohort width must be a positive integer, got {w!r}")
    for lo in range(0, len(members), w):
      trials = tuple(members[lo:lo + w])
      chunks.append(Chunk(trials, w, _padded_width(len(trials), w), keys[trials[0]],
                          len({archs[i] for i in trials}) > 1,
                          tuple(starts[i] for i in trials), tuple(ends[i] for i in trials),
                          tuple(bool(resumes[i]) for i in trials)))
  return tuple(chunks)


def whole_cohort(key: Hashable, size: int, start: int, end: int, resume: bool) -> Chunk:
  """The chunk of one call over `size` trials of one architecture and one step range
  (a PBT round: the whole population, no padding)."""
  return Chunk(tuple(range(size)), size, size, key, False, (int(start),) * size,
               (int(end),) * size, (bool(resume),) * size)


def lockstep_chunk(key: Hashable, size: int, width: int, start: int, end: int,
                   resumes: Sequence[bool], masked: bool) -> Chunk:
  """The chunk of one call whose `size` trials all run the batches of steps `[start,
  end)` (a pruned cohort's segment, `pruned_cohort`), padded like any partial chunk.

  Args:
    key: the trials' shape bucket; size: the trials (<= `width`), 0..size-1.
    width: the cohort width; start, end: the call's batch range.
    resumes: per trial, whether it starts from a given state; masked: their
      architectures differ.
  """
  if not 1 <= size <= width:
    raise ValueError(f"lockstep_chunk: {size} trials do not fit a cohort of width {width}")
  return Chunk(tuple(range(size)), width, _padded_width(size, width), key, bool(masked),
               (int(start),) * size, (int(end),) * size, tuple(bool(r) for r in resumes))


def program_summary(chunks: Sequence[Chunk]) -> dict[str, float | None]:
  """What a search reports of the program calls that ran.

  Returns:
    `mean_cohort_width`: mean real trials per call; `lane_utilization`: trial-steps
    that trained a real trial over the trial-steps the calls ran (below 1 when a
    ragged call held trials of different lengths or a partial chunk was padded;
    1.0 when the calls ran no step). None for both when no call ran.
  """
  if not chunks:
    return {"mean_cohort_width": None, "lane_utilization": None}
  lanes = sum(c.lane_steps for c in chunks)
  return {"mean_cohort_width": float(sum(len(c.trials) for c in chunks) / len(chunks)),
          "lane_utilization": float(sum(c.trial_steps for c in chunks) / lanes) if lanes else 1.0}

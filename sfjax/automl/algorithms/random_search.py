"""Model-free searches: random, grid and quasi-random (Sobol / Halton) over a space.

With `ask(n, fixed)`: random samples `space.fixing(fixed)`; grid hands out the
next grid points that agree with `fixed` (skipped ones stay for later asks);
quasi-random decodes the next points' free coordinates in the fixing (the
projection of a low-discrepancy sequence onto some coordinates is one too).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar

import numpy as np

from sfjax.automl.algorithms.base import AlgorithmSpec, Objective, Searcher, Suggestion
from sfjax.automl.space import ForbiddenConfigError, Space, SpaceError


@dataclasses.dataclass(frozen=True)
class RandomSearch(AlgorithmSpec):
  """Independent uniform samples (log-uniform for log parameters).

  `ask(n, fixed)` samples `space.fixing(fixed)`: the free keys are uniform as ever.
  """

  name: ClassVar[str] = "random"
  seed: int = 0

  def build(self, space: Space, objective: Objective) -> Searcher:
    return RandomSearcher(self, space, objective)


class RandomSearcher(Searcher):
  """Independent samples of the space (random search; PBT's initial populations)."""

  def _propose(self, n):
    space = self.sampling_space
    return [self._new_suggestion(space.sample(self._rng)) for _ in range(n)]


@dataclasses.dataclass(frozen=True)
class GridSearch(AlgorithmSpec):
  """Every config of `space.grid(...)`, in order (or shuffled by `seed`), then finished.

  `ask(n, fixed)` hands out the next grid points (in that order) that agree with
  `fixed`, fewer or none when the rest of the grid has fewer (a value off the grid
  matches nothing); the points it passes over stay for later asks.
  """

  name: ClassVar[str] = "grid"
  num_points_per_float: int = 3
  num_points_per_int: int | None = None
  shuffle: bool = False
  seed: int = 0

  def build(self, space: Space, objective: Objective) -> Searcher:
    return _GridSearcher(self, space, objective)


class _GridSearcher(Searcher):

  def __init__(self, spec: GridSearch, space, objective):
    super().__init__(spec, space, objective)
    grid = space.grid(spec.num_points_per_float, spec.num_points_per_int)
    if spec.shuffle:
      grid = [grid[i] for i in np.random.default_rng(spec.seed).permutation(len(grid))]
    self._grid = grid
    self._position = 0  # every point before it was handed out
    self._taken: set[int] = set()  # points after it handed out by fixed asks

  @property
  def size(self) -> int:
    """Number of grid points."""
    return len(self._grid)

  @property
  def finished(self):
    return self._position >= len(self._grid)

  def _propose(self, n):
    fixed = self.ask_fixed
    chosen: list[int] = []
    for i in range(self._position, len(self._grid)):
      if len(chosen) == n:
        break
      if i not in self._taken and self._grid[i].agrees(fixed):
        chosen.append(i)
    self._taken.update(chosen)
    while self._position in self._taken:
      self._taken.remove(self._position)
      self._position += 1
    return [self._new_suggestion(self._grid[i]) for i in chosen]

  def _extra_core(self):
    core: dict[str, Any] = {"position": self._position}
    if self._taken:
      core["taken"] = sorted(self._taken)
    return core

  def _load_extra_core(self, core):
    self._position = int(core["position"])
    self._taken = {int(i) for i in core.get("taken", ())}


@dataclasses.dataclass(frozen=True)
class QuasiRandomSearch(AlgorithmSpec):
  """Low-discrepancy points of the unit cube (scrambled Sobol or Halton), decoded.

  Points that decode to a forbidden config are skipped; the sequence position is
  the state. `ask(n, fixed)` decodes the free coordinates of the next points in
  `space.fixing(fixed)` (the fixed keys' coordinates are dropped), so the free keys
  still follow the low-discrepancy sequence.
  """

  name: ClassVar[str] = "qmc"
  sequence: str = "sobol"
  seed: int = 0
  max_skips: int = 1000

  def __post_init__(self):
    if self.sequence not in ("sobol", "halton"):
      raise ValueError(f"QuasiRandomSearch.sequence: {self.sequence!r} is not 'sobol' or 'halton'")

  def build(self, space: Space, objective: Objective) -> Searcher:
    return _QuasiRandomSearcher(self, space, objective)


class _QuasiRandomSearcher(Searcher):
  spec: QuasiRandomSearch

  def __init__(self, spec: QuasiRandomSearch, space, objective):
    super().__init__(spec, space, objective)
    self._position = 0
    self._engine = self._make_engine()

  def _make_engine(self):
    if not self.space.num_dims:
      return None
    from scipy.stats import qmc  # pylint: disable=g-import-not-at-top  (0.7 s to import)
    kind = qmc.Sobol if self.spec.sequence == "sobol" else qmc.Halton
    return kind(d=self.space.num_dims, scramble=True, seed=self.spec.seed)

  def _next_point(self) -> np.ndarray:
    self._position += 1
    if self._engine is None:
      return np.zeros(0)
    with warnings.catch_warnings():
      # Sobol warns unless points are drawn in powers of two; one at a time keeps
      # the sequence independent of batch sizes, which resume relies on.
      warnings.simplefilter("ignore", UserWarning)
      return self._engine.random(1)[0]

  def _propose(self, n):
    space = self.sampling_space
    free = [i for i, key in enumerate(self.space.dims) if key in space.dims]
    out: list[Suggestion] = []
    skips = 0
    while len(out) < n:
      try:
        out.append(self._new_suggestion(space.decode(self._next_point()[free])))
      except ForbiddenConfigError:
        skips += 1
        if skips > self.spec.max_skips:
          raise SpaceError(f"quasi-random search skipped {skips} forbidden points in a row; "
                           f"clauses: {list(space.forbidden)}") from None
    return out

  def _extra_core(self):
    return {"position": self._position}

  def _load_extra_core(self, core):
    self._position = int(core["position"])
    self._engine = self._make_engine()
    if self._engine is not None:
      self._engine.fast_forward(self._position)

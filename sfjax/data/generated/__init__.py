"""Data sets generated with a planted click model, so every run knows its oracle AUC.

  SyntheticCTR (`synthetic`)      Criteo-like one-hot fields and dense features
  MultihotCTR (`multihot`)        bags, long bags and a history sequence
  planted / multihot_model        the label models behind them (first order, FM pairs,
                                  bag contents, target-vs-history similarity, dense)
"""

from sfjax.data.generated.multihot import MultihotConfig, MultihotCTR
from sfjax.data.generated.synthetic import (
  SyntheticConfig,
  SyntheticCTR,
  bounded_power_law_ranks,
  make_row_sampler,
)

__all__ = [
  "MultihotCTR",
  "MultihotConfig",
  "SyntheticCTR",
  "SyntheticConfig",
  "bounded_power_law_ranks",
  "make_row_sampler",
]

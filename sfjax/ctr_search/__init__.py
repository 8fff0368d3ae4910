"""sfjax.ctr_search: the CTR search driver built on `sfjax.automl` and `sfjax.cohorts`.

Search defaults (`search_defaults()`: every field of a search config, owned here) and
the config's check, the search loop (ask a round, group it into cohorts, run them
through an executor, tell the study; or, async, a queue of cohorts free workers take:
`DISPATCH_FILE` holds its busy fraction), local and Dask executors, PBT searches,
TensorBoard events and the final report. Concrete spaces are passed in
(`CTRSearchSpace`), never imported.
"""

from sfjax.ctr_search.defaults import search_defaults
from sfjax.ctr_search.dispatch import DISPATCH_FILE
from sfjax.ctr_search.search_config import (
  SearchConfigError,
  check_flag_overrides,
  make_space,
  make_task,
  parse_cohort_width,
)
from sfjax.ctr_search.search_loop import run_search
from sfjax.ctr_search.search_round import form_cohorts
from sfjax.ctr_search.space_provider import CTRSearchSpace

__all__ = ["CTRSearchSpace", "DISPATCH_FILE", "SearchConfigError", "check_flag_overrides",
           "form_cohorts", "make_space", "make_task", "parse_cohort_width", "run_search",
           "search_defaults"]

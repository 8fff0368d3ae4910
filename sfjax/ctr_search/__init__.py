"""sfjax.ctr_search: the CTR search driver built on `sfjax.automl` and `sfjax.cohorts`.

Search config and its check, the search loop (ask a round, group it into cohorts,
run them through an executor, tell the study), local and Dask executors, PBT
searches, TensorBoard events and the final report. Concrete spaces are passed in
(`CTRSearchSpace`), never imported.
"""

from sfjax.ctr_search.search_loop import run_search
from sfjax.ctr_search.space_provider import CTRSearchSpace

__all__ = ["CTRSearchSpace", "run_search"]

"""Durable studies: a crash-safe trial journal (`journal`, its study events `events`),
trial records, quota filters, the winners (`selection`), exports, a live Optuna storage
mirror (`optuna_mirror`, for optuna-dashboard) and the AUC-latency trade-off (`tradeoff`)."""

from sfjax.automl.study.journal import Journal, JournalError, JournalLockedError
from sfjax.automl.study.optuna_mirror import OptunaMirror
from sfjax.automl.study.quota import Quota, QuotaFilter, check_quotas, limit_quotas
from sfjax.automl.study.study import Study
from sfjax.automl.study.tradeoff import select_within_auc
from sfjax.automl.study.trial_record import StudyError, TrialRecord

__all__ = [
    "Journal", "JournalError", "JournalLockedError", "OptunaMirror", "Quota", "QuotaFilter",
    "Study", "StudyError", "TrialRecord", "check_quotas", "limit_quotas", "select_within_auc",
]

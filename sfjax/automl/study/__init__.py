"""Durable studies: a crash-safe trial journal (`journal`, its study events `events`),
trial records, quota filters, the winners (`selection`) and exports."""

from sfjax.automl.study.journal import Journal, JournalError, JournalLockedError
from sfjax.automl.study.quota import Quota, QuotaFilter, check_quotas, limit_quotas
from sfjax.automl.study.study import Study
from sfjax.automl.study.trial_record import StudyError, TrialRecord

__all__ = [
    "Journal", "JournalError", "JournalLockedError", "Quota", "QuotaFilter", "Study",
    "StudyError", "TrialRecord", "check_quotas", "limit_quotas",
]

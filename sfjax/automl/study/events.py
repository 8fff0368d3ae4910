"""A study's journal events: the header that pins its settings, and their replay.

The first line of `journal.jsonl` is a header (`_FORMAT`, space, algorithm,
objective, Pareto directions); reopening with other settings is an error naming
the field (`check_header`). Then `ask`, `requeue` and `tell` events follow, each
`ask` and `tell` with the searcher's small core state. `replay` rebuilds the
trial records and the searcher's state from them: its history and pending trials
come from the events themselves, so the journal grows linearly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sfjax.automl.algorithms.base import Suggestion
from sfjax.automl.study import trial_record
from sfjax.automl.study.journal import JournalError
from sfjax.automl.study.trial_record import StudyError, TrialRecord

_FORMAT = "sfjax.study/1"
_HEADER_FIELDS = ("space", "algorithm", "objective", "directions")


class Replayed(NamedTuple):
  """A study's state after its journal's events.

  Attributes:
    trials: trial id -> record.
    searcher_state: the `Searcher.load_state_dict` dict (`core`, `history`,
      `pending`), or None when no ask or tell was journaled.
    pending: ids of trials asked and never told, in ask order (to re-queue).
  """

  trials: dict[int, TrialRecord]
  searcher_state: dict[str, Any] | None
  pending: list[int]


def header(settings: Mapping[str, Any]) -> dict[str, Any]:
  """The header event of a study with `settings` (`_HEADER_FIELDS` -> JSON values)."""
  return {"event": "header", "format": _FORMAT, **{k: settings[k] for k in _HEADER_FIELDS}}


def check_header(path: str, stored_line: tuple[int, Mapping[str, Any]],
                 expected: Mapping[str, Any]) -> None:
  """Checks a journal's first (line, record) against the header the study expects.

  Raises:
    JournalError: not a header of this format.
    StudyError: a field differs (the message names it and how).
  """
  line, stored = stored_line
  if stored.get("event") != "header" or stored.get("format") != _FORMAT:
    raise JournalError(path, line, f"expected a {_FORMAT!r} header, got {str(stored)[:200]}")
  for field in _HEADER_FIELDS:
    if stored.get(field) != expected[field]:
      raise StudyError(f"{path} was created with a different {field}: "
                       f"{_difference(stored.get(field), expected[field])}")


def _difference(stored, given) -> str:
  """A short description of how two JSON values differ (top-level keys for dicts)."""
  if isinstance(stored, dict) and isinstance(given, dict):
    if "params" in stored and "params" in given and stored["params"] != given["params"]:
      return "params " + _difference(stored["params"], given["params"])
    parts = [f"{k}: stored {stored.get(k)!r}, given {given.get(k)!r}"
             for k in sorted(set(stored) | set(given)) if stored.get(k) != given.get(k)]
    return "; ".join(parts)[:2000]
  return f"stored {stored!r}, given {given!r}"[:2000]


def replay(journal_path: str, records: Sequence[tuple[int, Mapping[str, Any]]]) -> Replayed:
  """The state after the (line, event) `records` that follow the header.

  Raises:
    JournalError: a bad event (names the file and line): unknown, malformed, a
      trial asked twice, or a requeue / tell of a trial not running.
  """
  trials: dict[int, TrialRecord] = {}
  core, history, pending = None, [], {}
  for line, record in records:
    event = record.get("event")
    try:
      if event == "ask":
        for d in record["suggestions"]:
          s = Suggestion.from_dict(d)
          if s.trial_id in trials:
            raise ValueError(f"trial {s.trial_id} asked twice")
          trials[s.trial_id] = trial_record.asked(s, record["time"])
          pending[s.trial_id] = d
        core = record["core"]
      elif event == "requeue":
        for trial_id in record["trial_ids"]:
          t = trial_record.running(trials, trial_id)
          trials[trial_id] = trial_record.handed_out_again(t, record["time"])
      elif event == "tell":
        t = trial_record.running(trials, record["trial_id"])
        trials[t.trial_id] = trial_record.finished(t, record)
        history.append({"suggestion": pending.pop(t.trial_id), "metrics": record["metrics"],
                        "status": record["status"]})
        core = record["core"]
      else:
        raise ValueError(f"unknown event {event!r}")
    except (KeyError, ValueError, TypeError, StudyError) as e:
      raise JournalError(journal_path, line, f"bad {event} event: {e}") from None
  state = None if core is None else {"core": core, "history": history,
                                     "pending": list(pending.values())}
  return Replayed(trials, state, list(pending))

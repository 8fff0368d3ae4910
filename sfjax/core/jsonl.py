"""Reading `.jsonl` files (metrics.jsonl, trials.jsonl) written line by line."""

from __future__ import annotations

import json
import os
from typing import Any


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The JSON objects of a `.jsonl` file, in order ([] if the file is absent).

  A torn or garbled line (a crash mid-write) and lines that are not objects are
  skipped: the writers flush whole lines, so only the last one can be torn.
  """
  if not os.path.exists(path):
    return []
  records = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if isinstance(record, dict):
        records.append(record)
  return records

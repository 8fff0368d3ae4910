"""How every benchmark reports: one JSON line last on stdout, optionally also to a file."""

import json
import sys


def emit_json_line(result: dict, out_path: str = "") -> str:
  """Prints `result` as one sorted JSON line (and writes it to `out_path` if given)."""
  line = json.dumps(result, sort_keys=True)
  if out_path:
    with open(out_path, "w") as f:
      f.write(line + "\n")
  sys.stdout.write(line + "\n")
  sys.stdout.flush()
  return line

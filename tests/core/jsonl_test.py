"""read_jsonl: objects in order, torn / garbled / non-object lines skipped, absent file empty."""

from sfjax.core.jsonl import read_jsonl


def test_reads_objects_and_skips_torn_lines(tmp_path):
  path = tmp_path / "m.jsonl"
  path.write_text('{"step": 1}\n[1, 2]\nnot json\n{"step": 2, "auc": 0.5}\n{"step": 3, "au')
  assert read_jsonl(str(path)) == [{"step": 1}, {"step": 2, "auc": 0.5}]
  assert read_jsonl(str(tmp_path / "absent.jsonl")) == []

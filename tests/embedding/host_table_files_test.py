"""The mmap host table's directory: files created sparse, checked on open, removed only if a table."""

import json
import os

import numpy as np
import pytest

from sfjax.embedding import host_table_files as files
from sfjax.embedding.host_table import HostTable, HostTableSpec


def test_created_files_reopen_and_count(tmp_path):
  values, slots, flags = files.create_arrays(str(tmp_path), 10, 3, 2)
  values[4], slots[4], flags[[4, 7]] = 1.5, -2.0, True
  spec = HostTableSpec(10, 3, 2, 0, 0.1, (0.0, 0.0))
  files.write_meta(str(tmp_path), spec, 2, clean=True)
  for array in (values, slots, flags):
    array.flush()
  meta = files.read_table_meta(str(tmp_path / files.META_FILE))
  assert meta["num_materialised"] == 2 and meta["clean"] and meta["width"] == 3
  values, slots, flags = files.open_arrays(str(tmp_path), 10, 3, 2, writable=False)
  assert values[4].tolist() == [1.5] * 3 and slots[4].tolist() == [-2.0, -2.0]
  assert files.count_written(flags) == 2
  with pytest.raises(ValueError, match=r"values\.npy: header says shape \(10, 3\)"):
    files.open_arrays(str(tmp_path), 10, 4, 2, writable=False)
  (tmp_path / files.META_FILE).write_text(json.dumps({**meta, "clean": "yes"}))
  with pytest.raises(ValueError, match="key 'clean' has wrong type str"):
    files.read_table_meta(str(tmp_path / files.META_FILE))


def test_count_written_scans_in_blocks(monkeypatch):
  flags = np.zeros(1000, np.bool_)
  flags[[0, 499, 500, 999]] = True
  monkeypatch.setattr(files, "_SCAN_ROWS", 7)
  assert files.count_written(flags) == 4


def test_discard_mmap_table_removes_only_a_host_table(tmp_path):
  path = tmp_path / "host"
  table = HostTable.create_mmap(str(path), 10, 2, 1, seed=0, init_stddev=0.1,
                                initial_slot_row=np.zeros(1, np.float32))
  table.close()
  (path / "meta.json.tmp").write_text("{")  # a run killed while rewriting its metadata
  assert files.discard_mmap_table(str(path)) and not path.exists()
  assert not files.discard_mmap_table(str(path))
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("keep")
  with pytest.raises(ValueError, match="not a host table directory"):
    files.discard_mmap_table(str(other))
  assert (other / "notes.txt").exists()
  a_file = tmp_path / "a_file"
  a_file.write_text("keep")
  with pytest.raises(ValueError, match="not a host table directory"):
    files.discard_mmap_table(str(a_file))
  assert a_file.read_text() == "keep"


def test_discard_mmap_table_removes_a_creation_killed_before_its_metadata(tmp_path):
  path = tmp_path / "host"
  HostTable.create_mmap(str(path), 10, 2, 1, seed=0, init_stddev=0.1,
                        initial_slot_row=np.zeros(1, np.float32)).close()
  os.remove(path / "meta.json")  # killed after the data files, before meta.json
  assert sorted(os.listdir(path))  # the data files are left
  assert files.discard_mmap_table(str(path)) and not path.exists()
  mixed = tmp_path / "mixed"
  HostTable.create_mmap(str(mixed), 10, 2, 1, seed=0, init_stddev=0.1,
                        initial_slot_row=np.zeros(1, np.float32)).close()
  os.remove(mixed / "meta.json")
  (mixed / "notes.txt").write_text("keep")  # not only the table's own files: not ours
  with pytest.raises(ValueError, match="not a host table directory"):
    files.discard_mmap_table(str(mixed))
  assert (mixed / "notes.txt").exists() and len(os.listdir(mixed)) > 1


def test_first_missing_directory(tmp_path):
  assert files.first_missing_directory(str(tmp_path)) is None
  assert files.first_missing_directory(str(tmp_path / "a" / "b")) == str(tmp_path / "a")
  (tmp_path / "a").mkdir()
  assert files.first_missing_directory(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")


def test_remove_created_keeps_what_existed_before(tmp_path):
  path = tmp_path / "a" / "b"
  path.mkdir(parents=True)
  for name in ("values.npy", "slots.npy", "materialised.npy", "meta.json", "meta.json.tmp"):
    (path / name).write_bytes(b"x")
  files.remove_created(str(path), str(tmp_path / "a"))
  assert os.listdir(tmp_path) == []
  path.mkdir(parents=True)
  (path / "values.npy").write_bytes(b"x")
  (path / "notes.txt").write_text("keep")
  files.remove_created(str(path), str(tmp_path / "a"))
  assert os.listdir(path) == ["notes.txt"]  # a foreign file: the directories stay
  (path / "notes.txt").unlink()
  files.remove_created(str(path), None)  # the directory existed before: kept, emptied
  assert path.is_dir()


def test_write_meta_failure_leaves_the_old_metadata_and_no_tmp(tmp_path, monkeypatch):
  path = tmp_path / "host"
  HostTable.create_mmap(str(path), 10, 2, 1, seed=0, init_stddev=0.1,
                        initial_slot_row=np.zeros(1, np.float32)).close()
  before = (path / "meta.json").read_text()

  def no_space(fd):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "fsync", no_space)
  spec = HostTableSpec(10, 2, 1, 0, 0.1, (0.0,))
  with pytest.raises(OSError, match="No space left on device"):
    files.write_meta(str(path), spec, 3, False)
  assert (path / "meta.json").read_text() == before
  assert not (path / "meta.json.tmp").exists()

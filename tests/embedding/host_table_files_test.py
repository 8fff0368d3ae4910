"""The mmap host table's directory: files created sparse, checked on open, removed only if a table."""

import json
import os

import numpy as np
import pytest

from sfjax.embedding import host_table_files as files
from sfjax.embedding import row_dtype
from sfjax.embedding.bit_flags import BitFlags
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
  for name in ("values.npy", "slots.npy", "written.npy", "materialised.npy", "meta.json",
               "meta.json.tmp"):
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


def test_version_2_flags_are_bits(tmp_path):
  values, slots, flags = files.create_arrays(str(tmp_path), 20, 2, 1)
  assert isinstance(flags, BitFlags) and flags.size == 20
  flags[np.array([2, 17])] = True
  for array in (values, slots, flags):
    array.flush()
  assert np.load(tmp_path / "written.npy").tolist() == [0b100, 0, 0b10]
  assert sorted(os.listdir(tmp_path)) == ["slots.npy", "values.npy", "written.npy"]
  again = files.open_arrays(str(tmp_path), 20, 2, 1, writable=False)[2]
  assert again[np.arange(20)].tolist() == [i in (2, 17) for i in range(20)]
  with pytest.raises(FileNotFoundError, match="materialised.npy"):  # the version named is read
    files.open_arrays(str(tmp_path), 20, 2, 1, writable=False, version=1)


def _write_version_1(path, num_rows, width, slot_width):
  """A table directory as version 1 wrote it: values, slots and a [V] bool flag per row."""
  fmt = np.lib.format
  values = fmt.open_memmap(os.path.join(path, "values.npy"), "w+", np.float32, (num_rows, width))
  slots = fmt.open_memmap(os.path.join(path, "slots.npy"), "w+", np.float32,
                          (num_rows, slot_width))
  flags = fmt.open_memmap(os.path.join(path, "materialised.npy"), "w+", np.bool_, (num_rows,))
  values[3], slots[3], flags[3] = 0.5, 2.0, True
  for array in (values, slots, flags):
    array.flush()
  spec = HostTableSpec(num_rows, width, slot_width, 0, 0.1, (0.1,) * slot_width)
  files.write_meta(path, spec, 1, clean=True, version=1)


def test_a_version_1_table_still_opens_reads_and_writes(tmp_path):
  path = str(tmp_path / "old")
  os.makedirs(path)
  _write_version_1(path, 10, 2, 1)
  values, slots, flags = files.open_arrays(path, 10, 2, 1, writable=False, version=1)
  assert flags.dtype == np.bool_ and flags.tolist() == [i == 3 for i in range(10)]
  assert values[3].tolist() == [0.5, 0.5] and slots[3].tolist() == [2.0]
  table = HostTable.open_mmap(path)
  assert table.version == 1 and table.num_materialised == 1
  assert table.gather(np.array([3]))[0].tolist() == [[0.5, 0.5]]
  table.scatter(np.array([7]), np.full((1, 2), 4.0, np.float32), np.ones((1, 1), np.float32))
  table.close()
  assert sorted(os.listdir(path)) == ["materialised.npy", "meta.json", "slots.npy", "values.npy"]
  assert files.read_table_meta(os.path.join(path, files.META_FILE))["version"] == 1
  again = HostTable.open_mmap(path)
  assert again.written_ids().tolist() == [3, 7] and again.gather(np.array([7]))[0].tolist() == [
      [4.0, 4.0]]
  assert files.discard_mmap_table(path) and not os.path.exists(path)


def test_a_new_table_is_version_2_and_an_unknown_version_is_refused(tmp_path):
  path = str(tmp_path / "t")
  table = HostTable.create_mmap(path, 10, 2, 1, seed=0, init_stddev=0.1, initial_slot_row=[0.1])
  assert table.version == files.FORMAT_VERSION == 2
  table.close()
  meta_path = os.path.join(path, files.META_FILE)
  meta = files.read_table_meta(meta_path)
  assert meta["version"] == 2
  with open(meta_path, "w") as f:
    json.dump({**meta, "version": 3}, f)
  with pytest.raises(ValueError, match=r"t/meta.json: unsupported host table format "
                     r"'sfjax.host_table' version 3 \(expected 'sfjax.host_table' version 1 or 2\)"):
    HostTable.open_mmap(path)


def test_a_table_without_slots_half_width_rows_and_read_only_maps(tmp_path):
  values, slots, flags = files.create_arrays(str(tmp_path), 6, 4, 0, "bfloat16")
  assert slots.shape == (6, 0) and slots.dtype == np.float32
  assert values.dtype == row_dtype.ROW_DTYPES["bfloat16"]
  assert sorted(os.listdir(tmp_path)) == ["values.npy", "written.npy"]  # no slots file
  values[1] = 0.5
  values.flush()
  values, slots, flags = files.open_arrays(str(tmp_path), 6, 4, 0, writable=False,
                                           dtype="bfloat16")
  assert slots.shape == (6, 0) and slots.dtype == np.float32
  assert values.dtype == row_dtype.ROW_DTYPES["bfloat16"]
  assert values[1].astype(np.float32).tolist() == [0.5] * 4
  assert not values.flags.writeable and not flags.store.flags.writeable
  assert files.open_arrays(str(tmp_path), 6, 4, 0, writable=True,
                           dtype="bfloat16")[2].store.flags.writeable

"""The bundle manifest: format and version checked, every listed file's digest verified."""

import json

import pytest

from sfjax.serving import manifest


def _bundle(tmp_path, **overrides):
  (tmp_path / "a.bin").write_bytes(b"0123456789")
  m = {"format": manifest.FORMAT_NAME, "version": manifest.FORMAT_VERSION,
       "files": [manifest.file_entry(str(tmp_path), "a.bin")], **overrides}
  (tmp_path / manifest.MANIFEST_FILE).write_text(json.dumps(m))
  return str(tmp_path)


def test_a_good_bundle_verifies(tmp_path):
  m = manifest.verify_bundle(_bundle(tmp_path))
  assert m["files"] == [{"file": "a.bin", "bytes": 10, "crc32": 0xA684C7C6}]


@pytest.mark.parametrize("damage,why", [(b"0123456780", "corrupt"), (b"012345678", "size 9 vs 10")])
def test_an_altered_or_truncated_file_is_named(damage, why, tmp_path):
  path = _bundle(tmp_path)
  (tmp_path / "a.bin").write_bytes(damage)
  with pytest.raises(manifest.BundleError, match=f"{tmp_path / 'a.bin'}: .*{why}"):
    manifest.verify_bundle(path)
  (tmp_path / "a.bin").unlink()
  with pytest.raises(manifest.BundleError, match="a.bin: missing or unreadable"):
    manifest.verify_bundle(path)


@pytest.mark.parametrize("overrides,match", [({"format": "other"}, "not a serving bundle"),
                                             ({"version": 99}, "bundle format version 99")])
def test_another_format_or_version_is_refused(overrides, match, tmp_path):
  with pytest.raises(manifest.BundleError, match=f"manifest.json: {match}"):
    manifest.read_bundle_manifest(_bundle(tmp_path, **overrides))
  (tmp_path / manifest.MANIFEST_FILE).write_text("{not json")
  with pytest.raises(manifest.BundleError, match="manifest.json: unreadable manifest"):
    manifest.read_bundle_manifest(str(tmp_path))

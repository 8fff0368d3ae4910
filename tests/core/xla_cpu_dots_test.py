"""train.xla_cpu_dots: which library XLA:CPU computes the train steps' dots with."""

import pytest

from sfjax.core import ConfigError, without_xla_cpu_dots, xla_cpu_compiler_options
from sfjax.core import xla_cpu_dots as dots

_EIGEN = {"xla_cpu_experimental_ynn_fusion_type": ""}


@pytest.mark.parametrize("text, vendor", [
    ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n", "AuthenticAMD"),
    ("processor : 0\nvendor_id : GenuineIntel\nvendor_id : AuthenticAMD\n", "GenuineIntel"),
    ("processor\t: 0\nCPU implementer\t: 0x41\n", ""),  # an ARM machine names no vendor_id
    ("", ""),
])
def test_the_vendor_is_the_first_vendor_id_line(tmp_path, text, vendor):
  path = tmp_path / "cpuinfo"
  path.write_text(text)
  assert dots.cpu_vendor(str(path)) == vendor


def test_stray_bytes_and_colons_do_not_hide_the_vendor(tmp_path):
  path = tmp_path / "cpuinfo"
  path.write_bytes(b"model name\t: \xff\xfe odd\nvendor_id\t: Some:Vendor\n")
  assert dots.cpu_vendor(str(path)) == "Some:Vendor"


def test_an_unreadable_cpuinfo_names_no_vendor(tmp_path):
  assert dots.cpu_vendor(str(tmp_path / "missing")) == ""
  assert dots.cpu_vendor(str(tmp_path)) == ""  # a directory


@pytest.mark.parametrize("choice, vendor, resolved", [
    ("auto", "AuthenticAMD", "eigen"), ("auto", "GenuineIntel", "xla"), ("auto", "", "xla"),
    ("eigen", "GenuineIntel", "eigen"), ("xla", "AuthenticAMD", "xla"),
])
def test_auto_picks_eigen_on_amd_only(choice, vendor, resolved):
  assert dots.resolve(choice, vendor) == resolved
  options = dots.compiler_options(choice, "cpu", vendor)
  assert options == (_EIGEN if resolved == "eigen" else {})
  assert dots.compiler_options(choice, "gpu", vendor) == {}  # CPU compilations only
  assert dots.compiler_options(choice, "tpu", vendor) == {}


def test_auto_without_a_vendor_reads_this_machine(monkeypatch):
  monkeypatch.setattr(dots, "_this_cpu_vendor", lambda: "AuthenticAMD")
  assert dots.resolve("auto") == "eigen" and xla_cpu_compiler_options("auto", "cpu") == _EIGEN
  monkeypatch.setattr(dots, "_this_cpu_vendor", lambda: "GenuineIntel")
  assert dots.resolve("auto") == "xla" and xla_cpu_compiler_options("auto", "cpu") == {}


def test_a_bad_choice_names_the_field():
  with pytest.raises(ConfigError) as err:
    dots.compiler_options("mkl", "gpu")  # checked on any platform
  assert str(err.value) == ("config field train.xla_cpu_dots: 'mkl' is not one of 'auto', "
                            "'eigen', 'xla'")


def test_a_train_block_without_the_field_means_auto():
  assert dots.dots_choice({}) == "auto" and dots.dots_choice({"xla_cpu_dots": "xla"}) == "xla"


def test_the_default_reads_this_machines_cpuinfo():
  assert dots.cpu_vendor() == dots.cpu_vendor("/proc/cpuinfo")


def test_unrecorded_drops_the_field_at_any_depth_and_keeps_the_rest():
  tree = {"xla_cpu_dots": "eigen", "seed": 3,
          "steps": [{"train": {"xla_cpu_dots": "xla", "steps": 10}}, 4],
          "task": {"data": {"x": [1, 2]}, "xla_cpu_dots": "auto"}}
  assert dots.unrecorded(tree) == {"seed": 3, "steps": [{"train": {"steps": 10}}, 4],
                                   "task": {"data": {"x": [1, 2]}}}
  assert tree["task"]["xla_cpu_dots"] == "auto"  # the input is left as it was
  assert dots.unrecorded(5) == 5 and dots.unrecorded("xla_cpu_dots") == "xla_cpu_dots"
  assert without_xla_cpu_dots is dots.unrecorded

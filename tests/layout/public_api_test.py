"""The public API (issue #21, item 6): package roots re-export, applications import only them.

- experiments/, search_spaces/ and the notebooks' code cells import sfjax only as
  `from sfjax.<package> import <Name>`, with `Name` in that package root's `__all__` and not
  a module (read with `ast`, so a deep import fails here naming the file, line and import);
- every name in every package root's `__all__` resolves, and a name two roots export is
  the same object in both;
- no two sfjax modules define the same public (non-constant) top-level name.
"""

import ast
import collections
import importlib
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sfjax"
APPLICATIONS = ("experiments", "search_spaces")


def _packages() -> list[str]:
  """Dotted names of sfjax and every (sub-)package under it."""
  return sorted(".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py"))


def _is_package(dotted: str) -> bool:
  return (ROOT.joinpath(*dotted.split(".")) / "__init__.py").exists()


def _is_module(dotted: str) -> bool:
  path = ROOT.joinpath(*dotted.split("."))
  return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _static_all(package: str) -> list[str]:
  """The literal `__all__` of `package`'s root (empty when it has none)."""
  tree = ast.parse((ROOT.joinpath(*package.split(".")) / "__init__.py").read_text())
  for node in tree.body:
    if (isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)):
      return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
  return []


def _notebook_code(path: pathlib.Path) -> str:
  """The code cells of a notebook, shell / magic lines blanked (line numbers kept per cell)."""
  cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
  lines = []
  for cell in cells:
    source = "".join(cell["source"])
    lines += ["" if ln.lstrip().startswith(("!", "%")) else ln for ln in source.splitlines()]
  return "\n".join(lines)


def _sources() -> dict[str, str]:
  out = {}
  for folder in APPLICATIONS:
    for path in sorted((ROOT / folder).rglob("*.py")):
      out[str(path.relative_to(ROOT))] = path.read_text()
  for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
    out[str(path.relative_to(ROOT))] = _notebook_code(path)
  return out


def deep_imports(name: str, source: str) -> list[str]:
  """'file:line: import' for each import of sfjax in `source` that is not from a root's API."""
  bad = []
  for node in ast.walk(ast.parse(source, filename=name)):
    if isinstance(node, ast.Import):
      bad += [f"{name}:{node.lineno}: import {a.name}" for a in node.names
              if a.name.split(".")[0] == "sfjax"]
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sfjax":
      module = node.module
      for alias in node.names:
        where = f"{name}:{node.lineno}: from {module} import {alias.name}"
        if not _is_package(module):
          bad.append(f"{where} ({module} is not a package root)")
        elif _is_module(f"{module}.{alias.name}"):
          bad.append(f"{where} (a module)")
        elif alias.name not in _static_all(module):
          bad.append(f"{where} (not in {module}.__all__)")
  return bad


def test_applications_and_notebooks_import_only_package_roots():
  bad = [b for name, source in _sources().items() for b in deep_imports(name, source)]
  assert not bad, "deep imports (use `from sfjax.<package> import <Name>`):\n" + "\n".join(bad)


def test_the_checker_names_each_kind_of_deep_import():
  source = ("import sfjax.train.loop\n"
            "from sfjax.train import loop\n"
            "from sfjax.train.loop import train_and_evaluate\n"
            "from sfjax.train import no_such_name\n"
            "from sfjax.train import train_and_evaluate\n")
  assert deep_imports("x.py", source) == [
      "x.py:1: import sfjax.train.loop",
      "x.py:2: from sfjax.train import loop (a module)",
      "x.py:3: from sfjax.train.loop import train_and_evaluate "
      "(sfjax.train.loop is not a package root)",
      "x.py:4: from sfjax.train import no_such_name (not in sfjax.train.__all__)",
  ]


def test_notebook_code_cells_are_read(tmp_path):
  nb = tmp_path / "n.ipynb"
  nb.write_text(json.dumps({"cells": [
      {"cell_type": "markdown", "source": ["from sfjax.train import loop"]},
      {"cell_type": "code", "source": ["!pip install x\n", "from sfjax.train import loop\n"]}]}))
  assert deep_imports("n.ipynb", _notebook_code(nb)) == [
      "n.ipynb:2: from sfjax.train import loop (a module)"]


@pytest.mark.parametrize("package", [p for p in _packages() if p != "sfjax"])
def test_every_package_root_has_an_api_that_resolves(package):
  module = importlib.import_module(package)
  names = module.__all__
  assert names == _static_all(package), f"{package}.__all__ must be a literal list"
  assert len(set(names)) == len(names), f"{package}.__all__ repeats a name"
  missing = [n for n in names if not hasattr(module, n)]
  assert not missing, f"{package}.__all__ names what it does not define: {missing}"


def test_the_top_level_package_loads_its_subpackages_on_use():
  import sfjax  # pylint: disable=import-outside-toplevel
  found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
  assert set(sfjax.SUBPACKAGES) == found
  assert sfjax.train is importlib.import_module("sfjax.train")
  with pytest.raises(AttributeError, match="no attribute 'nope'"):
    sfjax.nope  # noqa: B018


def test_a_name_two_roots_export_is_one_object():
  owners = collections.defaultdict(list)
  for package in _packages():
    if package == "sfjax":
      continue
    module = importlib.import_module(package)
    for name in module.__all__:
      owners[name].append((package, getattr(module, name)))
  clashes = {name: [p for p, _ in found] for name, found in owners.items()
             if any(obj is not found[0][1] for _, obj in found)}
  assert not clashes, f"one name, different objects: {clashes}"


def _public_definitions() -> dict[str, list[str]]:
  """Public non-constant top-level name -> the sfjax modules that define it."""
  names = collections.defaultdict(list)
  for path in sorted(PACKAGE.rglob("*.py")):
    if path.name == "__init__.py":
      continue
    for node in ast.parse(path.read_text()).body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        found = [node.name]
      elif isinstance(node, ast.Assign):
        found = [t.id for t in node.targets if isinstance(t, ast.Name)]
      elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        found = [node.target.id]
      else:
        found = []
      for name in found:
        if not name.startswith("_") and not name.isupper():
          names[name].append(str(path.relative_to(ROOT)))
  return names


def test_no_two_modules_define_one_public_name():
  clashes = {name: where for name, where in _public_definitions().items() if len(where) > 1}
  assert not clashes, f"give each a precise name, or make it private: {clashes}"

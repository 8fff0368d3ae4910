"""The package's layers (WORKSPACE.md): one direction of imports, a test file per module.

Read from the source with `ast` (every import, also those inside functions), so a
new module that breaks the layering fails here, naming the file and the import.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sfjax"

# Subpackage -> the subpackages it may import (besides itself). Leaves share only `core`.
ALLOWED = {
    "core": set(),
    "data": {"core"},
    "models": {"core", "automl"},  # blocks declare their sub-spaces (DESIGN.md §4)
    "parallel": {"core"},
    "embedding": {"core", "data"},
    "checkpoint": {"core", "embedding", "parallel"},  # below train: reads and writes its state
    "train": {"core", "data", "embedding", "models", "parallel", "checkpoint"},
    "automl": {"core"},
    "cohorts": {"core", "data", "embedding", "models", "parallel", "train", "automl"},
    "structure": {"core", "data", "embedding", "models", "train", "cohorts"},
    "compress": {"core", "automl", "embedding", "models", "train"},
    "ctr_search": {"core", "data", "embedding", "models", "parallel", "train", "automl",
                   "cohorts"},
    "ctr_pipeline": {"core", "data", "embedding", "models", "train", "checkpoint", "automl",
                     "cohorts", "structure", "compress", "ctr_search", "serving"},
    # a trained model as a self-contained bundle and what serves it (its predictor imports
    # only core: a bundle is served without the model classes or the training code)
    "serving": {"core", "data", "embedding", "parallel", "models", "train", "checkpoint"},
    "viz": {"core"},  # figures from the files runs write; imports no training code
    "vision": {"core", "automl", "compress", "train"},  # image steps on the shared dense step
}
APPLICATIONS = ("search_spaces", "experiments")
# Modules without logic (only types), which need no test file of their own.
TYPE_ONLY = {"sfjax/core/types.py", "sfjax/train/state.py", "sfjax/ctr_search/space_provider.py"}


def _modules():
  return sorted(p for p in PACKAGE.rglob("*.py"))


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, dotted module) of every import in `path`, relative imports resolved."""
  tree = ast.parse(path.read_text(), filename=str(path))
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = path.relative_to(ROOT).with_suffix("").parts[:-node.level]
        out.append((node.lineno, ".".join(base + ((node.module,) if node.module else ()))))
      else:
        out.append((node.lineno, node.module))
  return out


def _subpackage(path: pathlib.Path) -> str | None:
  parts = path.relative_to(PACKAGE).parts
  return parts[0] if len(parts) > 1 else None


def _edges():
  """{(from subpackage, to subpackage): first 'file:line'}."""
  edges = {}
  for path in _modules():
    src = _subpackage(path)
    for line, module in _imports(path):
      parts = module.split(".")
      if parts[0] == "sfjax" and len(parts) > 1 and parts[1] in ALLOWED and parts[1] != src:
        edges.setdefault((src, parts[1]), f"{path.relative_to(ROOT)}:{line}")
  return edges


def test_every_subpackage_is_declared():
  found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
  assert found == set(ALLOWED), f"declare the layer of {found ^ set(ALLOWED)} in ALLOWED"


def test_library_never_imports_its_applications():
  leaks = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in _modules()
           for line, module in _imports(path) if module.split(".")[0] in APPLICATIONS]
  assert not leaks, leaks


def test_imports_follow_the_layers():
  bad = [f"{where}: {src} -> {dst}" for (src, dst), where in _edges().items()
         if src is None or dst not in ALLOWED[src]]
  assert not bad, bad


def test_subpackage_graph_has_no_cycle():
  graph = {}
  for src, dst in _edges():
    graph.setdefault(src, set()).add(dst)
  state = {}

  def visit(node, trail):
    if state.get(node) == "done":
      return
    assert state.get(node) != "open", f"import cycle: {' -> '.join(trail + [node])}"
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      visit(nxt, trail + [node])
    state[node] = "done"

  for node in sorted(graph):
    visit(node, [])


def test_the_checker_sees_a_cycle_and_a_leak(tmp_path):
  # The checks above must be able to fail: a module importing upward is found.
  bad = tmp_path / "sfjax" / "data" / "bad.py"
  bad.parent.mkdir(parents=True)
  bad.write_text("def f():\n  from sfjax.train import loop\n  import search_spaces.ctr\n")
  assert _imports(bad) == [(2, "sfjax.train"), (3, "search_spaces.ctr")]


def _has_logic(path: pathlib.Path) -> bool:
  tree = ast.parse(path.read_text())
  return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree))


def test_every_module_with_logic_has_a_test_file():
  missing = []
  for path in _modules():
    rel = str(path.relative_to(ROOT))
    if path.name == "__init__.py" or rel in TYPE_ONLY or not _has_logic(path):
      continue
    expected = ROOT / "tests" / _subpackage(path) / f"{path.stem}_test.py"
    # A sub-subpackage's tests may sit in the mirrored folder (tests/automl/pipeline/).
    nested = ROOT / "tests" / path.parent.relative_to(PACKAGE) / f"{path.stem}_test.py"
    if not expected.exists() and not nested.exists():
      missing.append(f"{rel} -> {expected.relative_to(ROOT)}")
  for path in sorted((ROOT / "search_spaces").glob("*.py")):
    if path.name != "__init__.py" and not (ROOT / "tests" / "search_spaces" / f"{path.stem}_test.py").exists():
      missing.append(str(path.relative_to(ROOT)))
  assert not missing, "modules without a sibling test file: " + ", ".join(missing)


def test_every_benchmark_has_a_smoke_test_and_a_config():
  # Each experiments/bench_X.py: tests/experiments/bench_X_test.py runs it in-process with the
  # smoke variant of experiments/configs/bench_X.py (tests/experiments/cli_test.py checks it).
  benches = sorted(p.stem for p in (ROOT / "experiments").glob("bench_*.py"))
  missing = [f"tests/experiments/{b}_test.py" for b in benches
             if not (ROOT / "tests" / "experiments" / f"{b}_test.py").exists()]
  missing += [f"experiments/configs/{b}.py" for b in benches
              if not (ROOT / "experiments" / "configs" / f"{b}.py").exists()]
  assert benches and not missing, missing

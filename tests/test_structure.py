"""The code's shape (issue 13): no import cycles among the modules of `converter` and
`readers`, at most 6 modules at the top of `converter/`, no function over 80 lines, and
the conversion path never imports the synthetic-data generator or private Keras modules.

Read from the source with `ast` (nothing is imported), so lazy imports inside
functions and `TYPE_CHECKING` imports count too: a cycle hidden behind a lazy import is
still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("converter", "readers")
MAX_TOP_LEVEL_MODULES = 6
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` refers to: itself, or the nearest package above it that is one."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {_owner(a.name, modules) for a in node.names} - {None}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    target = sub if sub in modules else _owner(node.module, modules)
                    if target is not None:
                        deps.add(target)
            elif isinstance(node, ast.ImportFrom) and node.level > 0:
                deps.add(f"<relative import in {name}>")
        deps.discard(name)
        graph[name] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_find_cycles_reports_a_planted_cycle_and_passes_a_chain():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycles_among_converter_and_readers_modules():
    graph = import_graph(_modules())
    relative = sorted(d for deps in graph.values() for d in deps if d.startswith("<"))
    assert not relative, f"use absolute imports: {relative}"
    assert find_cycles(graph) == []


def test_readers_never_import_the_converter():
    graph = import_graph(_modules())
    bad = {m: sorted(d for d in deps if d.split(".")[0] == "converter")
           for m, deps in graph.items() if m.split(".")[0] == "readers"}
    assert {m: d for m, d in bad.items() if d} == {}


def test_converter_has_at_most_six_top_level_modules():
    top = sorted(p.name for p in (ROOT / "converter").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_function_is_longer_than_80_lines():
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert long == []


def test_conversion_path_never_imports_the_test_data_generator():
    graph = import_graph(_modules())
    users = sorted(m for m, deps in graph.items() if "converter.testing.synth" in deps
                   and not m.startswith(("converter.testing", "converter.bench")))
    assert users == []


#: The one measured exception: the bench times a PyDataset through the adapter `model.fit`
#: builds (issue 30), which Keras does not export; it falls back to a public stand-in
#: when the adapter moves (`converter/bench/kerasfeed.py`). Nothing a user runs imports it.
PRIVATE_KERAS_ALLOWED = {("converter.bench.kerasfeed", "keras.src.trainers.data_adapters.py_dataset_adapter")}


def test_no_module_imports_private_keras_modules():
    offenders = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{name}: {n}" for n in names
                          if n.startswith("keras.src") and (name, n) not in PRIVATE_KERAS_ALLOWED]
    assert offenders == []


def test_every_format_has_its_home_and_one_registry_entry():
    from readers.formats import FileFormat
    from readers.formats.registry import ADAPTERS, ENCODERS

    for fmt in FileFormat:
        home = ROOT / "readers" / "formats" / fmt.value
        assert (home / "reader.py").is_file() and (home / "writer.py").is_file(), home
        assert type(ADAPTERS[fmt]).__module__ == f"readers.formats.{fmt.value}.reader"
        assert ENCODERS[fmt].__module__ == f"readers.formats.{fmt.value}.writer"


def test_conversion_and_its_workers_never_import_tensorflow(tmp_path):
    """A whole conversion (both formats, a forked worker pool and in-process) with
    TensorFlow and Keras made unimportable: the worker task, the encoders and the
    format registry stay NumPy-only."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('tensorflow', 'keras'): sys.modules[name] = None\n"
        "from converter.testing import synth\n"
        "from converter.convert import convert\n"
        "from converter.options import OutputOptions, RunOptions, SourceSpec\n"
        "src = synth.make_camvid(sys.argv[1] + '/src', splits={'train': 3, 'val': 2}, size=(20, 28), seed=3)\n"
        "for fmt, workers in (('tfrecord', 2), ('npz', 1)):\n"
        "    r = convert(SourceSpec(root=str(src.root)), sys.argv[1] + '/' + fmt,\n"
        "                OutputOptions(size=(16, 24), format=fmt), RunOptions(workers=workers))\n"
        "    assert r.published and r.samples_written == 5, r\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras') and sys.modules[m]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"

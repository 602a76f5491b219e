"""The house's arrows, read from the source with `ast`: api -> worker -> core -> kernels.

Every import counts, at module level or inside a function (a lazy import is still a
dependency), under `TYPE_CHECKING` too. The graph is at module granularity: `import pkg.sub`
and `from pkg import sub` depend on `pkg.sub` (a package's `__init__.py` is the module `pkg`),
`from pkg.sub import name` on `pkg.sub`, and relative imports resolve against the importing
module's package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRAPHED = ("core", "kernels")  # the packages that must hold no import cycle
ENGINE_MAX_LINES = 700


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `packages`."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The absolute names the module `name` (its file `path`) imports: a known module where
    the name is one (the longest known prefix of a dotted import), else the name as written."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()

    def resolve(dotted: str) -> str:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in known:
                return ".".join(parts[:n])
        return dotted

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in known else resolve(source))
    out.discard(name)
    return out


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> every name it imports (internal ones as module names)."""
    mods = modules(root, packages)
    known = set(mods) | set(modules(root, ("api", "worker")))
    return {name: imported(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or one importing itself
    (Tarjan's algorithm, iterative), each sorted; edges to names outside `graph` ignored."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))
    return found


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(graph: dict[str, set[str]], owner: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        if under(mod, owner)
        for dep in deps
        if any(under(dep, f) for f in forbidden)
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, GRAPHED)


def test_cycle_finder_finds_cycles():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"f"}}
    assert cycles(g) == [["a", "b", "c"], ["f"]]
    assert cycles({"a": {"b", "x"}, "b": set()}) == []


def test_graph_reads_lazy_relative_and_package_imports(tmp_path):
    pkg = tmp_path / "core" / "pkg"
    pkg.mkdir(parents=True)
    (tmp_path / "core" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from . import b\n    return b\n")
    (pkg / "b.py").write_text("from ..pkg.a import f\nimport celery.app\n")
    g = import_graph(tmp_path, ("core",))
    assert g["core.pkg"] == {"core.pkg.a"}
    assert g["core.pkg.a"] == {"core.pkg.b"}
    assert g["core.pkg.b"] == {"core.pkg.a", "celery.app"}
    assert cycles(g) == [["core.pkg.a", "core.pkg.b"]]
    assert violations(g, "core.pkg", ("celery",)) == ["core.pkg.b imports celery.app"]


def test_no_import_cycle(graph):
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_engine_is_a_library(graph):
    forbidden = (
        "core.jobs",
        "core.store",
        "core.training",
        "core.benchmark",
        "core.bench",
        "celery",
        "sqlalchemy",
        "api",
        "worker",
    )
    assert violations(graph, "core.engine", forbidden) == []


def test_models_do_not_import_the_engine(graph):
    assert violations(graph, "core.models", ("core.engine",)) == []


def test_kernels_import_no_service_code(graph):
    assert violations(graph, "kernels", ("core", "api", "worker")) == []


def test_engine_files_are_small():
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "core" / "engine").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > ENGINE_MAX_LINES
    }
    assert not long, f"over {ENGINE_MAX_LINES} lines: {long}"

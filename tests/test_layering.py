"""The package's layering (issue 28), checked on the import graph read from the source (every ``import`` of a
``trivium`` module, at module level or inside a function: a hidden import is an arrow all the same).

The layers, from the ground up; a module may import its own folder and the layers below it, never above:

    0  types, registry, faults, net, jsontext,    the words every part speaks
       files, threads
    1  config                                     the schema and its loading
    2  algorithm, models, tools                   pure functions, rollout engines, tool calls
    3  serve                                      the OpenAI-compatible endpoint over a rollout model
    4  rewards, envs, tasks                       what scores and what answers (judges call endpoints)
    5  buffer, sync, monitor                      moving data, weights and metrics between the parts
    6  explorer, trainer, workflows               the two roles, and what the explorer runs
    7  validation                                 a run's config checked across fields and against
                                                  the runtime it names (registries, data, models)
    8  launch                                     placement, stages, runs, the serve mode
    9  studio, cli                                what a user runs

The endpoint sits under its users (the agent workflow runs agents against it, a judge serves a local model
with it, the serve mode trains on its calls): it needs only the models, the tools and the config's schema.

Between files there is no import circle. ``KNOWN_UPWARD`` and ``KNOWN_CIRCLES`` list what today's code still
breaks (the redesign of issue 28 removes them step by step): a new arrow up or a new circle fails, and so
does an entry that no longer holds, so the lists only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = [
    {"types", "registry", "faults", "net", "jsontext", "files", "threads", ""},  # "" is trivium/__init__.py
    {"config"},
    {"algorithm", "models", "tools"},
    {"serve"},
    {"rewards", "envs", "tasks"},
    {"buffer", "sync", "monitor"},
    {"explorer", "trainer", "workflows"},
    {"validation"},
    {"launch"},
    {"studio", "cli"},
]

# (importer, imported) that run up the layers today (none: keep it so)
KNOWN_UPWARD: set[tuple[str, str]] = set()

# groups of files that import each other in a loop today (none: keep it so)
KNOWN_CIRCLES: list[set[str]] = []


def import_graph(src: Path = SRC, package: str = "trivium") -> dict[str, set[str]]:
    """``{module: the package's modules it imports}``, names without the package prefix."""
    paths = {}
    for path in (src / package).rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        paths[".".join(parts)] = path

    def known(name: str) -> str | None:  # the module a dotted name lies in
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {known(a.name) for a in node.names if a.name.split(".")[0] == package}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        here = here.rpartition(".")[0]
                    base = f"{here}.{base}".rstrip(".")
                if base.split(".")[0] != package:
                    continue
                found |= {
                    f"{base}.{a.name}" if f"{base}.{a.name}" in paths else known(base) for a in node.names
                }
        found.discard(None)
        found.discard(module)
        graph[module.removeprefix(package).lstrip(".")] = {m.removeprefix(package).lstrip(".") for m in found}
    return graph


def layer_of(module: str) -> int:
    folder = module.split(".")[0]
    for i, names in enumerate(LAYERS):
        if folder in names:
            return i
    raise AssertionError(f"{module}: its folder {folder!r} is in no layer of LAYERS: place it there")


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if a.split(".")[0] != b.split(".")[0] and layer_of(b) > layer_of(a)
    }


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other in a loop (strongly connected, more than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_runs_up_the_layers():
    found = upward(import_graph())
    new = sorted(found - KNOWN_UPWARD)
    assert not new, f"imports that run up the layers (see the module docstring): {new}"
    gone = sorted(KNOWN_UPWARD - found)
    assert not gone, f"these arrows are gone: remove them from KNOWN_UPWARD: {gone}"


def test_no_import_circles_between_files():
    found = circles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert not new, f"files that import each other in a loop: {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not gone, f"these circles are gone or changed: update KNOWN_CIRCLES: {gone}"


def test_the_rules_can_fail(tmp_path):
    """A circle and an arrow up in a made-up package are found, hidden function-level imports included."""
    pkg = tmp_path / "pkg"
    for folder in ("config", "serve", "types"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "a.py").write_text("def f():\n    from pkg.serve.b import g\n")
    (pkg / "serve" / "b.py").write_text("from pkg.config import a\nfrom . import c\n")
    (pkg / "serve" / "c.py").write_text("import pkg.types\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["serve.b"] == {"config.a", "serve.c"} and graph["serve.c"] == {"types"}
    assert upward(graph) == {("config.a", "serve.b")}
    assert circles(graph) == [{"config.a", "serve.b"}]

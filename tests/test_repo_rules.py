"""Rules of the code base that a machine can check: file length, dependency directions, cheap imports."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "trivium"

# (folder, pattern that must not be imported there, why)
FORBIDDEN = [
    (
        "algorithm",
        r"^\s*(from|import) trivium\.(trainer|explorer|launch|buffer|models|config)",
        "algorithm/ is pure math",
    ),
    (
        "explorer",
        r"^\s*(from|import) trivium\.trainer",
        "explorer and trainer meet only through buffer and sync",
    ),
    (
        "trainer",
        r"^\s*(from|import) trivium\.explorer",
        "explorer and trainer meet only through buffer and sync",
    ),
    ("config", r"^\s*(from|import) trivium\.(launch|explorer|trainer)", "config knows no runtime"),
]


def py_files(folder=SRC):
    return sorted(folder.rglob("*.py"))


def test_no_source_file_over_600_lines():
    long = {str(p.relative_to(SRC)): n for p in py_files() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"split these by concept: {long}"


@pytest.mark.parametrize(("folder", "pattern", "why"), FORBIDDEN)
def test_dependency_rules(folder, pattern, why):
    hits = [
        f"{p.relative_to(SRC)}:{i}"
        for p in py_files(SRC / folder)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]
    assert not hits, f"{why}: {hits}"


@pytest.mark.parametrize("folder", ["launch", "sync"])
def test_orchestration_never_dispatches_on_attributes(folder):
    """Weight movement goes through the WeightSync protocol and batches through BatchSource: no
    ``hasattr(sync, "send")``-style branching on what an object happens to have."""
    hits = [
        f"{p.relative_to(SRC)}:{i}"
        for p in py_files(SRC / folder)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bhasattr\(", line)
    ]
    assert not hits, hits


def private_imports(root: Path) -> list[str]:
    """``from trivium.x import _name`` anywhere under ``root`` (at any indentation): a helper that another
    module needs is public in a module both can import (e.g. ``algorithm/advantage_parts.py``)."""
    import ast

    hits = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trivium"):
                hits += [
                    f"{p.relative_to(root)}:{node.lineno} {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return hits


def test_no_module_imports_another_modules_private_names(tmp_path):
    assert not private_imports(SRC)
    (tmp_path / "bad.py").write_text(
        "def f():\n    from trivium.x import (\n        y,\n        _z,\n    )\n"
    )
    (tmp_path / "fine.py").write_text(
        "from trivium.rewards import code as _code\nfrom trivium import __version__\n"
    )
    assert private_imports(tmp_path) == ["bad.py:2 _z"]


def ray_imports_outside_launch(root: Path) -> list[str]:
    """Files under ``root`` outside ``launch/`` that import Ray (at any indentation: lazy imports count)."""
    pattern = re.compile(r"^\s*(import ray\b|from ray(\.| )|import ray\.)", re.M)
    return [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*.py"))
        if "launch" not in p.relative_to(root).parts and pattern.search(p.read_text())
    ]


def test_only_launch_may_import_ray():
    assert not ray_imports_outside_launch(SRC)


def test_the_ray_rule_can_fail(tmp_path):
    """The rule above is only worth something if it catches a violation."""
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "ok.py").write_text("import ray\n")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "bad.py").write_text("def f():\n    from ray.util import placement_group\n")
    (tmp_path / "trainer" / "fine.py").write_text("import rayon_like  # not ray\nx = 'import ray'\n")
    assert ray_imports_outside_launch(tmp_path) == ["trainer/bad.py"]


def test_package_import_is_cheap():
    code = "import sys, trivium, trivium.models; print(int('torch' in sys.modules), int('transformers' in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["0", "0"], "importing trivium (or trivium.models) must not import torch or transformers"


def _tracked_text_files():
    repo = SRC.parents[1]
    names = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout
    for name in names.splitlines():
        path = repo / name
        if path.suffix in {".py", ".md", ".yaml", ".yml", ".json", ".toml", ".txt", ""} and path.is_file():
            yield name, path.read_text(errors="replace")


def test_docs_and_code_cite_only_what_users_have():
    """Citations go to docs/ of this repository or to papers: a reference folder beside the repository (or
    a reference file by its bare name) is not shipped, so a user cannot follow it."""
    bad = [
        f"{name}:{n}"
        for name, text in _tracked_text_files()
        for n, line in enumerate(text.splitlines(), 1)
        if re.search(
            r"\.\./shared/|(?<![\w/])ALGORITHMS\.md|(?<![\w/])DESIGN\.md|(?<![\w/])MISSION\.md", line
        )
    ]
    assert not bad, f"cite docs/ or the paper instead: {bad[:10]}"


def test_no_machine_paths_in_tracked_files():
    """Results and docs record paths relative to the repository: no home, sandbox or temp folders."""
    pattern = re.compile(r"(?<![\w.])/(work|home|root|Users|tmp/pytest-of)/")
    bad = [
        f"{name}:{n}"
        for name, text in _tracked_text_files()
        if name != "tests/test_repo_rules.py"
        for n, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]
    assert not bad, f"machine paths: {bad[:10]}"

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


def test_only_launch_may_import_ray():
    hits = [
        str(p.relative_to(SRC))
        for p in py_files()
        if "launch" not in p.parts and re.search(r"^\s*(import ray|from ray)", p.read_text(), re.M)
    ]
    assert not hits


def test_package_import_is_cheap():
    code = "import sys, trivium, trivium.models; print(int('torch' in sys.modules), int('transformers' in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["0", "0"], "importing trivium (or trivium.models) must not import torch or transformers"

"""The package as users install it (issue 31 item 5): the wheel and the sdist hold what they should and
nothing else, the wheel installed (not editable) into a fresh venv runs from an empty folder, and
``trivium example`` hands out the examples the wheel carries.

``.ci/run`` also installs the wheel into a fresh venv with pip resolving its dependencies from the index
(stage "the wheel in a fresh venv"); the slow test here borrows this environment's dependencies instead
(a path file), so it needs no index and runs anywhere.
"""

from __future__ import annotations

import email
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from trivium.cli import main
from trivium.launch.shipped_examples import copy_example, examples_root, list_examples

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the CI's)

ROOT = Path(__file__).resolve().parents[1]


def tracked(*folders: str) -> list[str]:
    listed = subprocess.run(["git", "ls-files", *folders], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return listed.stdout.splitlines()


def test_pyproject_lists_every_folder_of_the_package_and_of_the_examples():
    """pyproject.toml lists the packages by hand (a mapped package is not found by ``packages.find``): a new
    subpackage, or a new example folder, must be added there or the wheel goes without it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = set()
    for path in tracked("src/trivium", "examples"):
        parts = Path(path).parent.parts
        if parts[:2] == ("src", "trivium"):
            parts = parts[1:]
        elif parts[:1] == ("examples",):
            parts = ("trivium", *parts)
        while parts:
            folders.add(".".join(parts))
            parts = parts[:-1]
    assert listed == folders - {"src"}


def test_example_lists_the_examples_and_copies_one_with_what_it_reads_from(tmp_path, capsys, monkeypatch):
    assert main(["example"]) == 0
    listing = capsys.readouterr().out
    names = [e.name for e in list_examples()]
    assert {"quickstart", "decoupled", "countdown", "agents", "plugins"} <= set(names)
    assert all(line.split()[0] in names for line in listing.splitlines()[: len(names)])
    assert "Quickstart: SFT warm-up on noisy demonstrations" in listing

    # the decoupled example reads the quickstart's data (../quickstart/data): both are copied
    assert main(["example", "decoupled", "--into", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"trivium run --config {tmp_path}/examples/decoupled/grpo.yaml" in out
    copied = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    shipped = sorted(
        f"examples/{e}/{p.relative_to(examples_root() / e).as_posix()}"
        for e in ("decoupled", "quickstart")
        for p in (examples_root() / e).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert copied == shipped

    # from that folder, the README's commands work as written
    monkeypatch.chdir(tmp_path)
    assert main(["check-config", "examples/quickstart/grpo_word_problems.yaml"]) == 0

    # copying again: refused, nothing written; the quickstart it needs is kept, not overwritten
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["example", "decoupled"]) == 2
    assert "examples/decoupled already exists" in capsys.readouterr().err
    written, kept = copy_example("custom_loss", Path("."))
    assert written == [Path("examples/custom_loss")] and kept == [Path("examples/quickstart")]
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())

    assert main(["example", "nope"]) == 2
    assert "no example named 'nope'; the examples are: agents," in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.integration
def test_the_wheel_installs_into_a_fresh_venv_and_runs_the_quickstart_from_an_empty_folder(tmp_path):
    pytest.importorskip("build")
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("trivium-*.whl")
    (sdist,) = dist.glob("trivium-*.tar.gz")

    # what each holds
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read("trivium-0.1.0.dist-info/METADATA"))
    assert "trivium/examples/quickstart/grpo_word_problems.yaml" in names
    assert "trivium/examples/quickstart/data/train.jsonl" in names
    assert "trivium/studio/static/index.html" in names and "trivium/py.typed" in names
    shipped = {f"trivium/{p}" for p in tracked("examples")}
    assert shipped <= set(names)
    for name in names:
        assert name.startswith(("trivium/", "trivium-")), name  # no tests/, benchmarks/, runs/ at the top
        assert "__pycache__" not in name and not name.endswith(".pyc"), name
    with tarfile.open(sdist) as tar:
        sdist_names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    assert "pyproject.toml" in sdist_names and "README.md" in sdist_names
    assert "examples/quickstart/grpo_word_problems.yaml" in sdist_names
    assert not [n for n in sdist_names if n.startswith(("tests", "docs", "benchmarks", "runs", ".ci"))]
    assert not [n for n in sdist_names if "__pycache__" in n or n.endswith(".pyc")]

    # the extras name what they install (the wheel's metadata: what pip reads)
    extras = set(meta.get_all("Provides-Extra"))
    named = {
        "ray",
        "vllm",
        "trackers",
        "studio",
        "tensorboard",
        "wandb",
        "mlflow",
        "postgres",
        "bench",
        "test",
    }
    assert named | {"dev"} <= extras
    requires = meta.get_all("Requires-Dist")

    def extra(name: str) -> set[str]:
        return {
            r.split(";")[0].split(">")[0].split("<")[0].strip() for r in requires if f'extra == "{name}"' in r
        }

    assert extra("ray") == {"ray"} and extra("postgres") == {"psycopg2-binary"} and extra("vllm") == {"vllm"}
    assert extra("studio") == {"fastapi", "uvicorn"}
    assert extra("trackers") == {"tensorboard", "wandb", "mlflow-skinny", "alembic"}
    assert {"ray", "wandb", "trl", "psycopg2-binary", "trivium[test]"} <= extra("dev")
    assert {"pytest", "build", "setuptools"} <= extra("test")
    assert not [r for r in requires if ";" not in r and r.split(">")[0] in {"ray", "wandb", "trl", "pytest"}]

    # a fresh venv, the wheel installed in it (not editable); its dependencies are this environment's,
    # through a path file (a path line, not a site dir: this environment's editable trivium stays out)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "borrowed_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"

    def trivium(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(venv / "bin" / "trivium"), *args],
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    where = subprocess.run(
        [str(python), "-c", "import trivium; print(trivium.__file__)"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip().startswith(site), where  # the wheel's copy, not the checkout's

    assert trivium("--version").stdout.strip() == "trivium 0.1.0"
    listing = trivium("example")
    assert listing.returncode == 0 and "quickstart" in listing.stdout, listing.stderr
    copied = trivium("example", "quickstart")
    assert copied.returncode == 0 and "trivium run --config examples/quickstart/grpo_word_problems.yaml" in (
        copied.stdout
    ), copied.stderr
    config = "examples/quickstart/grpo_word_problems.yaml"
    checked = trivium("check-config", config)
    assert checked.returncode == 0, checked.stderr
    short = ["--set", "stages.0.buffer.total_steps=3", "--set", "stages.0.trainer.warmup_steps=0"]
    short += ["--set", "stages.1.buffer.total_steps=3", "--set", "stages.1.buffer.batch_size=4"]
    ran = trivium("run", "--config", config, *short)
    assert ran.returncode == 0, ran.stderr[-4000:]
    run_dir = empty / "runs" / "quickstart" / "word-problems"
    steps = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in line]
    assert len(steps) == 6, steps  # 3 SFT and 3 GRPO steps

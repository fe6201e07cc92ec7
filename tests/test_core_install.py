"""The core install (``pip install -e .``, no extras) runs ``trivium --version`` and ``check-config`` (issue 27
item 6), and a config that needs an extra is told which one to install.

The contributor's environment has every extra, so each check runs in a child Python where the extras'
modules are made absent (``sys.modules[name] = None``: importing them raises ModuleNotFoundError and
``importlib.util.find_spec`` answers None, as for a package that is not installed). ``.ci/run`` also runs
the core install itself, before it installs ``[dev]``.
"""

import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the CI's); 3.10 skips these checks

ROOT = Path(__file__).resolve().parents[1]
# the top-level module of each requirement of the extras (their import names where they differ)
IMPORT_NAMES = {"psycopg2-binary": "psycopg2", "mlflow-skinny": "mlflow"}


def extra_modules() -> set[str]:
    """Every module an extra installs that the core does not require."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    return {IMPORT_NAMES.get(n, n).replace("-", "_") for n in extras - core if n != "trivium"}


def _name(requirement: str) -> str:
    for stop in "<>=!;[ ":
        requirement = requirement.split(stop)[0]
    return requirement.strip().lower()


def core_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``trivium ARGS`` in a child Python that has none of the extras."""
    code = (
        "import sys\n"
        f"for name in {sorted(extra_modules())!r}:\n    sys.modules[name] = None\n"
        "from trivium.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_the_extras_are_the_packages_the_core_does_without():
    modules = extra_modules()
    assert {"ray", "wandb", "tensorboard", "mlflow", "trl", "playwright", "psycopg2", "pytest"} <= modules
    assert not modules & {"torch", "transformers", "fastapi", "sqlalchemy"}


def test_the_core_install_shows_its_version_and_checks_the_quickstart():
    version = core_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("trivium "), version.stderr
    checked = core_cli("check-config", "examples/quickstart/grpo_word_problems.yaml")
    assert checked.returncode == 0, checked.stderr
    assert "OK: examples/quickstart/grpo_word_problems.yaml is valid" in checked.stderr


@pytest.mark.parametrize(
    ("override", "field", "extra"),
    [
        ("cluster.backend=ray", "cluster.backend", "pip install 'trivium[ray]'"),
        ("monitor.backends=[wandb]", "monitor.backends", "pip install 'trivium[wandb]'"),
    ],
)
def test_a_config_that_needs_an_extra_names_it(override, field, extra):
    checked = core_cli("check-config", "examples/quickstart/grpo_word_problems.yaml", "--set", override)
    assert checked.returncode == 2, checked.stderr
    assert field in checked.stderr and extra in checked.stderr and "Traceback" not in checked.stderr

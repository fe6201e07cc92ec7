"""The README against the code (issue 17): counts, the install lines CI uses, the newcomer run's rules.

``.ci/readme.py`` runs the README's command blocks in CI (minutes); these checks are the fast part of it,
run by every ``pytest``: what the README counts equals what the registries hold, ``.ci/run`` installs with
the README's lines, every rule of the newcomer run still matches a README command (a rule cannot outlive
its command), each shortened run is a valid config, and the ``check-config`` transcript is the real output.
"""

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest

from trivium.algorithm.presets import PRESETS
from trivium.algorithm.registry import AGGREGATIONS
from trivium.cli import main as cli
from trivium.validation import load_config

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
CI_RUN = (REPO / ".ci" / "run").read_text()
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _load_newcomer_run():
    spec = importlib.util.spec_from_file_location("ci_readme", REPO / ".ci" / "readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


newcomer = _load_newcomer_run()


def count(text: str) -> int:
    return int(text) if text.isdigit() else WORDS.index(text)


def test_every_preset_count_in_the_readme_is_the_registrys():
    counts = [count(n) for n in re.findall(r"\b(\w+) presets\b", README)]
    assert counts and set(counts) == {len(PRESETS.names())}, (counts, PRESETS.names())


def test_the_status_table_lists_every_preset():
    row = next(line for line in README.splitlines() if line.startswith("| algorithms |"))
    listed = row.split("presets assembled from registered parts")[1].split("; KL as a loss")[0]
    names = []
    for name in re.findall(r"`(\w+)`", listed):
        names.append(names[-1] + name if name.startswith("_") else name)  # `reinforceplusplus` (+`_baseline`)
    missing = set(PRESETS.names()) - set(names)
    assert not missing, f"presets the README's algorithms row does not list: {sorted(missing)}"


def test_the_aggregation_count_is_the_registrys():
    (n,) = re.findall(r"\b(\w+) loss aggregation modes\b", README)
    assert count(n) == len(AGGREGATIONS.names())


def _commands(block: str) -> list[list[str]]:
    return [words for line in block.splitlines() if (words := shlex.split(line, comments=True))]


def test_ci_installs_with_the_readmes_cpu_lines():
    """.ci/run runs the README's lines; only the index may be overridden (TORCH_INDEX_URL, offline)."""
    section = README.split("## Install\n")[1].split("\n## ")[0]
    readme_lines = _commands(section.split("```bash\n")[1].split("```")[0])
    default = re.search(r'TORCH_INDEX_URL="\$\{TORCH_INDEX_URL:-(\S+)\}"', CI_RUN).group(1)
    ci = _commands(CI_RUN.replace('"$TORCH_INDEX_URL"', default))
    start = ci.index(readme_lines[0])
    assert ci[start : start + len(readme_lines)] == readme_lines
    assert default == "https://download.pytorch.org/whl/cpu"
    # the contributor's install comes after the core's, which checks the quickstart alone first (issue 27)
    contributor = next(b for b in section.split("```bash\n")[1:] if "[dev]" in b).split("```")[0]
    dev = _commands(contributor)
    assert dev == [["pip", "install", "-e", ".[dev]"]] and ci.index(dev[0]) > start
    core_check = ["trivium", "check-config", "examples/quickstart/grpo_word_problems.yaml"]
    assert start < ci.index([*core_check, ">", "/dev/null"]) < ci.index(dev[0])


def _readme_commands():
    return [
        cmd
        for kind, lines in newcomer.blocks(README)
        if kind == "bash"
        for cmd in filter(None, map(newcomer.parse_command, lines))
    ]


def test_every_rule_of_the_newcomer_run_matches_a_readme_command():
    texts = [cmd.text for cmd in _readme_commands()]
    for pattern, *_ in newcomer.SKIP + newcomer.SHORTEN + newcomer.SERVERS:
        assert any(re.search(pattern, t) for t in texts), f"rule {pattern!r} matches no README command"


def test_the_newcomer_run_skips_only_what_it_must_and_runs_the_rest():
    plans = {cmd.text: newcomer.plan(cmd)[0] for cmd in _readme_commands()}
    skipped = sorted(t for t, action in plans.items() if action == "skip")
    wheel_stage = ("python -m build", "trivium example quickstart --into")  # .ci/run runs them from the wheel
    assert all(
        t.startswith(("pip install", "pytest", "trivium check-template Qwen/", *wheel_stage)) for t in skipped
    )
    stage = CI_RUN.split('stage "the wheel in a fresh venv"')[1].split("\nstage ")[0]
    assert "python -m build" in stage and "trivium example quickstart" in stage and "check-config" in stage
    for must_run in (
        "trivium run --config examples/quickstart/grpo_word_problems.yaml",
        "trivium run -c examples/decoupled/grpo.yaml --set mode=explore",
        "trivium run -c examples/decoupled/grpo.yaml --set mode=train",
        "wait",
        "trivium --version",
    ):
        assert plans[must_run] in ("run", "shorten"), must_run


@pytest.mark.parametrize("text", [c.text for c in _readme_commands() if newcomer.plan(c)[0] == "shorten"])
def test_each_shortened_run_is_a_valid_config(text, plugin_registries):
    cmd = newcomer.parse_command(text)
    _, extra, _ = newcomer.plan(cmd)
    words = cmd.words + shlex.split(extra)
    config = words[words.index("-c" if "-c" in words else "--config") + 1]
    overrides = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    for stage in load_config(REPO / config, overrides, check_files=False).stages:
        assert stage.config.buffer.total_steps <= 6, (stage.name, stage.config.buffer.total_steps)
        assert stage.config.checkpoint_root == newcomer.CHECK_ROOT


def _transcript_is_the_real_output(subcommand, capsys, monkeypatch):
    ((command, *shown),) = [
        lines
        for kind, lines in newcomer.blocks(README)
        if kind == "$" and f"trivium {subcommand} " in lines[0]
    ]
    words = shlex.split(command[2:])
    assert words[:2] == ["trivium", subcommand]
    monkeypatch.chdir(REPO)  # the README's paths are relative to the repository root
    cli(words[1:])
    printed = capsys.readouterr()
    assert newcomer.transcript_matches(shown, (printed.out + printed.err).splitlines()) == ""


def test_the_check_config_transcript_is_the_real_output(capsys, monkeypatch):
    _transcript_is_the_real_output("check-config", capsys, monkeypatch)


@pytest.mark.slow  # builds the quickstart's tokenizer and reads its data (~1 min on 2 busy cores)
def test_the_doctor_transcript_is_the_real_output(capsys, monkeypatch):
    _transcript_is_the_real_output("doctor", capsys, monkeypatch)


def test_transcript_lines_match_with_ellipses_only():
    assert newcomer.transcript_matches(["a: 1, ..."], ["a: 1, 2, 3"]) == ""
    assert newcomer.transcript_matches(["a: 1"], ["a: 2"]) != ""
    assert newcomer.transcript_matches(["a"], ["a", "b"]) == "1 lines shown, 2 printed"

"""`trivium debug` (issue 33 item 1): one task through each built-in workflow, printed as the trainer would
see it; the mask printed is the experience's own, and --out writes records the trajectory viewer reads."""

import json
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from trivium.cli import main as cli
from trivium.launch.debug import mask_runs, render_tokens
from trivium.types import Experience
from trivium.workflows.base import Workflow


def write_config(tmp: Path, model: Path, taskset: dict, **top) -> Path:
    cfg = {
        "project": "debug",
        "name": "t",
        "checkpoint_root": str(tmp / "runs"),
        "model": {"path": str(model)},
        "explorer": {"rollout": {"max_tokens": 6}},
        "buffer": {"batch_size": 2, "total_steps": 1, "taskset": {"repeat_times": 3, **taskset}},
        **top,
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def rows(tmp: Path, name: str, *items) -> str:
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return str(path)


def printed_runs(text: str) -> list[list[str]]:
    """The 'tokens:' line of each experience, as [[kind, count], ...]."""
    lines = [line.removeprefix("tokens: ") for line in text.splitlines() if line.startswith("tokens: ")]
    return [[part.split(" ") for part in line.split(" · ")] for line in lines]


def check_mask_matches(out_file: Path, text: str, n: int) -> list[dict]:
    records = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert len(records) == n
    for record, runs in zip(records, printed_runs(text), strict=True):
        kinds = ["prompt"] * len(record["prompt_ids"]) + ["action" if m else "env" for m in record["mask"]]
        expanded = [kind for kind, count in runs for _ in range(int(count))]
        assert expanded == kinds  # what is printed is the experience's own mask, token for token
    return records


def test_math_row_printed_with_its_mask_operators_and_advantages(tmp_path, tiny_model_dir, capsys):
    ts = {
        "path": rows(tmp_path, "t.jsonl", {"question": "2 plus 3?", "answer": "5"}),
        "reward_fn": "exact_match",
    }
    config = write_config(tmp_path, tiny_model_dir, ts)
    cfg = yaml.safe_load(config.read_text())
    cfg["buffer"]["experience_ops"] = [{"name": "zero_variance"}]
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "debug.jsonl"
    assert cli(["debug", "-c", str(config), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "task t:0 (workflow math, reward exact_match, 3 sample(s))" in text
    assert text.count("--- experience") == 3 and "[[" in text  # piped: plain markers, no colour codes
    assert "\033[" not in text
    assert "experience operators ['zero_variance']" in text
    assert "advantages (grpo" in text and "time:" in text and "in the model engine" in text
    records = check_mask_matches(out, text, 3)
    assert all(r["stage"] and r["response_text"] for r in records)
    assert all(len(r["advantage"]) == len(r["mask"]) for r in records)  # per response token, for the viewer


def test_a_prompt_of_your_own_and_a_sample_count(tmp_path, tiny_model_dir, capsys):
    ts = {
        "path": rows(tmp_path, "t.jsonl", {"question": "2 plus 3?", "answer": "5"}),
        "reward_fn": "exact_match",
    }
    config = write_config(tmp_path, tiny_model_dir, ts)
    assert cli(["debug", "-c", str(config), "--prompt", "7 plus 1?", "--n", "1"]) == 0
    text = capsys.readouterr().out
    assert "7 plus 1?" in text and text.count("--- experience") == 1
    assert "a group of one has no baseline" in text
    assert cli(["debug", "-c", str(config), "--task", "5"]) == 2
    assert "--task 5: the task set" in capsys.readouterr().err


def test_a_multi_turn_environment_s_tokens_are_shown_off_the_mask(tmp_path, tiny_model_dir, capsys):
    ts = {
        "path": rows(tmp_path, "t.jsonl", {"n": 3}),
        "workflow": "multi_turn",
        "workflow_args": {"env": "tests.workflows.conftest:CountdownEnv", "env_args": {"turns": 2}},
        "reward_fn": "exact_match",
    }
    config = write_config(tmp_path, tiny_model_dir, ts)
    out = tmp_path / "debug.jsonl"
    assert cli(["debug", "-c", str(config), "--n", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "{{" in text and " · env " in text  # the environment's turn, not trained on
    records = check_mask_matches(out, text, 2)
    assert all(not all(r["mask"]) for r in records)


@pytest.mark.parametrize(
    ("workflow", "row", "reward", "args"),
    [
        ("countdown", {"numbers": [3, 4, 5], "target": 12}, "countdown", {}),
        ("code", {"question": "Write f.", "tests": ["assert True"]}, "code", {}),
        (
            "step_wise",
            {"n": 2},
            "exact_match",
            {"env": "tests.workflows.conftest:CountdownEnv", "env_args": {"turns": 2}},
        ),
        # failed episodes retried from the turn diagnose() names: the retries are printed too
        ("reflect_retry", {"n": 2}, "exact_match", {"env": "tests.workflows.conftest:EvenEnv"}),
        # a ReAct agent with the calculator tool, as examples/agents/calculator.yaml runs it
        (
            "react",
            {"question": "What is 2 + 3?", "answer": "5"},
            "math_verify",
            {"env": "calculator", "env_args": {"system_prompt": "", "show_tools": False}, "max_turns": 2},
        ),
        # a user's agent (plain OpenAI-client code) through the endpoint the workflow serves
        (
            "openai_agent",
            {"question": "What is 1 + 2?", "answer": "3"},
            "math_verify",
            {"agent": "tests.workflows.agents_for_tests:calculator_agent", "agent_args": {"max_turns": 2}},
        ),
    ],
)
def test_other_built_in_workflows(tmp_path, tiny_model_dir, capsys, workflow, row, reward, args):
    ts = {"path": rows(tmp_path, "t.jsonl", row), "workflow": workflow, "reward_fn": reward}
    if args:
        ts["workflow_args"] = args
    config = write_config(tmp_path, tiny_model_dir, ts)
    out = tmp_path / "debug.jsonl"
    assert cli(["debug", "-c", str(config), "--n", "2", "--out", str(out)]) == 0, capsys.readouterr()
    text = capsys.readouterr().out
    runs = len(printed_runs(text))
    assert runs >= 2, text  # --n 2: at least one experience per run (an agent may make several)
    check_mask_matches(out, text, runs)


class Exploding(Workflow):
    """A user's workflow (a plugin, named module:Class) that raises."""

    fields: ClassVar = {"n": (int,)}

    def run(self, task, model):
        raise RuntimeError("environment exploded")


def test_a_failing_plugin_workflow_is_reported_with_its_reason(tmp_path, tiny_model_dir, capsys):
    ts = {
        "path": rows(tmp_path, "t.jsonl", {"n": 3}),
        "workflow": "tests.launch.test_debug:Exploding",
        "reward_fn": "exact_match",
    }
    config = write_config(tmp_path, tiny_model_dir, ts)
    assert cli(["debug", "-c", str(config), "--n", "1"]) == 1
    text = capsys.readouterr().out
    assert "FAILED" in text and "environment exploded" in text


def test_render_marks_each_run(tiny_model_dir):
    import torch

    from trivium.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    ids = tok.encode("a b c d e")
    e = Experience(
        tokens=torch.tensor(ids),
        prompt_length=1,
        action_mask=torch.tensor([True, False, False, True][: len(ids) - 1] + [True] * (len(ids) - 5)),
        logprobs=torch.zeros(len(ids) - 1),
    )
    assert [k for k, _ in mask_runs(e)][:4] == ["prompt", "action", "env", "action"]
    plain = render_tokens(e, tok, color=False)
    assert plain.count("[[") == plain.count("]]") >= 2 and plain.count("{{") == 1
    assert "\033[32m" in render_tokens(e, tok, color=True)

"""examples/plugins: every seam a user can plug into, named from YAML (plugins: or module:attr)."""

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from trivium.cli import main as cli
from trivium.config import ConfigError
from trivium.monitor.metrics import read_metrics
from trivium.validation import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugins"


def test_check_config_finds_every_plugin_part(plugin_registries):
    run = load_config(EXAMPLE / "plugins.yaml")
    from trivium.algorithm.presets import PRESETS
    from trivium.envs.base import ENVIRONMENTS
    from trivium.tools import TOOLS
    from trivium.workflows.agent import AGENTS
    from trivium.workflows.registry import WORKFLOWS

    assert [s.name for s in run.stages] == ["algorithm", "environment", "tool", "agent"]
    assert "math_hint" in WORKFLOWS and "grpo_capped" in PRESETS and "guess_number" in ENVIRONMENTS
    assert "word_length" in TOOLS and "one_shot" in AGENTS


@pytest.mark.integration
def test_every_plugin_part_is_called_in_a_run(tmp_path, plugin_registries):
    cfg = yaml.safe_load((EXAMPLE / "plugins.yaml").read_text())
    cfg["checkpoint_root"] = str(tmp_path / "runs")
    cfg["monitor"] = {"progress_bar": False}
    cfg["buffer"]["total_steps"] = 1
    # a copy of the example folder (and of the quickstart data it reads from ../quickstart): the config next
    # to my_plugins.py and the data, as the user's is
    shutil.copytree(EXAMPLE.parent / "quickstart" / "data", tmp_path / "quickstart" / "data")
    path = shutil.copytree(EXAMPLE, tmp_path / "plugins") / "test_every_seam.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 0
    records = {r["stage"]: r for r in read_metrics(tmp_path / "runs" / "plugins" / "every-seam")}
    assert "rollout/words" in records["algorithm"]  # the module:attr reward scored every sample
    assert "rollout/guesses" in records["environment"]  # the plugin environment stepped every episode
    assert "rollout/reply_chars" in records["agent"]  # the plugin agent ran every run
    for record in records.values():
        assert record["rollout/failed_tasks"] == 0 and "train/loss" in record


def test_the_plugin_preset_trains_with_the_plugin_policy_loss(plugin_registries):
    from trivium.trainer.spec import AlgorithmSpec

    (stage, *_) = load_config(EXAMPLE / "plugins.yaml").stages
    spec = AlgorithmSpec.from_config(stage.config.algorithm)
    assert (spec.advantage_fn, spec.policy_loss_fn, spec.policy_loss_args) == (
        "grpo",
        "capped_pg",
        {"cap": 2.0},
    )


def test_the_plugin_tool_and_environment_answer(plugin_registries):
    load_config(EXAMPLE / "plugins.yaml")
    from trivium.envs.base import make_env
    from trivium.types import Task

    tools = make_env("tools", tools=["word_length"], system_prompt="")
    tools.reset(Task("w:0", {"question": "Letters in river?", "answer": "5"}, "react", "exact_match"))
    call = '<tool_call>{"name": "word_length", "arguments": {"word": "river"}}</tool_call>'
    assert tools.step(call).observation[0]["content"] == "5"
    guess = make_env("guess_number", high=8)
    guess.reset(Task("g:0", {"target": 6}, "multi_turn", "exact_match"))
    assert "higher" in guess.step("3").observation and guess.step("6").reward == 1.0


def write(folder, name, text):
    (folder / name).write_text(textwrap.dedent(text))


@pytest.fixture
def user_folder(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    write(
        tmp_path,
        "my_rewards.py",
        """
        def len_reward(response, data):
            return -len(response) / 100
        """,
    )
    return tmp_path


def config(folder, **taskset):
    path = folder / "cfg.yaml"
    cfg = {"model": {"path": "Qwen/Qwen2.5-0.5B"}, "buffer": {"taskset": {"path": "train.jsonl", **taskset}}}
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_reward_next_to_the_config_is_found_by_module_attr(user_folder, plugin_registries, capsys):
    """The case of the issue: check-config answered 'unknown reward function' for my_rewards:len_reward."""
    assert cli(["check-config", str(config(user_folder, reward_fn="my_rewards:len_reward"))]) == 0


@pytest.mark.parametrize(
    ("taskset", "path", "says"),
    [
        ({"reward_fn": "my_rewards:nope"}, "buffer.taskset.reward_fn", "has no attribute 'nope'"),
        ({"reward_fn": "os:system"}, "buffer.taskset.reward_fn", "standard library"),
        ({"reward_fn": "my_rewards.len_reward"}, "buffer.taskset.reward_fn", "looks like a dotted path"),
        ({"workflow": "my_rewards:len_reward"}, "buffer.taskset.workflow", "not a subclass of"),
        (
            {"workflow_args": {"env": "nope"}, "workflow": "multi_turn"},
            "buffer.taskset.workflow_args",
            "unknown environment 'nope'",
        ),
        (
            {"workflow": "react", "workflow_args": {"tools": ["nope"]}},
            "buffer.taskset.workflow_args",
            "unknown tool 'nope'",
        ),
        (
            {"workflow": "openai_agent", "workflow_args": {"agent": "nope"}},
            "buffer.taskset.workflow_args",
            "unknown agent",
        ),
    ],
)
def test_bad_part_names_are_config_errors_naming_the_field(
    user_folder, plugin_registries, taskset, path, says
):
    with pytest.raises(ConfigError) as err:
        load_config(config(user_folder, **taskset))
    by_path = {p.path: p for p in err.value.problems}
    assert says in by_path[path].rule + by_path[path].fix


def test_a_plugin_that_fails_to_import_is_named(user_folder, plugin_registries):
    write(user_folder, "broken.py", "raise RuntimeError('boom')\n")
    cfg = yaml.safe_load(config(user_folder).read_text())
    cfg["plugins"] = ["broken", "no_such_module", "os"]
    (user_folder / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as err:
        load_config(user_folder / "cfg.yaml")
    rules = {p.path: p.rule for p in err.value.problems}
    assert "RuntimeError: boom" in rules["plugins[0]"]
    assert "No module named 'no_such_module'" in rules["plugins[1]"]
    assert "standard library" in rules["plugins[2]"]


def test_a_plugin_that_exits_on_import_is_a_problem_of_the_plugins_field(
    user_folder, plugin_registries, capsys
):
    """Issue 26 item 7: a plugin calling sys.exit(7) made check-config exit 7 with no message."""
    from trivium.cli import main as cli

    write(user_folder, "quits.py", "import sys\nsys.exit(7)\n")
    cfg = yaml.safe_load(config(user_folder).read_text())
    cfg["plugins"] = ["quits"]
    (user_folder / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert cli(["check-config", str(user_folder / "cfg.yaml")]) == 2
    err = capsys.readouterr().err
    assert "plugins[0]" in err and "sys.exit(7)" in err and "__main__" in err


def test_a_plugin_that_ends_the_process_on_import_is_a_problem_of_the_plugins_field(
    user_folder, plugin_registries, capsys
):
    """Issue 26 item 7: a plugin calling os._exit(0) on import gave check-config rc 0 with no "OK" line (and
    would end Studio, which validates in its own process). It is imported in a child process first."""
    from trivium.cli import main as cli

    write(user_folder, "ends.py", "import os, sys\nprint('bye', file=sys.stderr)\nos._exit(0)\n")
    write(user_folder, "crashes.py", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    cfg = yaml.safe_load(config(user_folder).read_text())
    cfg["plugins"] = ["ends", "crashes"]
    (user_folder / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert cli(["check-config", str(user_folder / "cfg.yaml")]) == 2
    err = capsys.readouterr().err
    assert "plugins[0]" in err and "ended the Python process" in err and "exit code 0; it said: bye" in err
    assert "plugins[1]" in err and "signal SIGSEGV" in err and "__main__" in err

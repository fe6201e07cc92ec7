"""Issue 17, item 1: how a stage's ``mode`` relates to the top-level one, and the decoupled example.

A stage's own ``mode`` wins over the top level's (the top level is the default of stages that set none).
The issue: the quickstart with ``buffer.storage`` and a checkpoint sync, run with ``--set mode=explore``,
failed with "use method: memory, or run mode explore and mode train as two processes", which is what the
user was doing: ``--set mode`` never reached the stages. Now the error names each stage that ignores it and
the fix; ``examples/decoupled/grpo.yaml`` is a config that runs as the README shows.
"""

from pathlib import Path

import pytest
import yaml

from trivium.config import ConfigError
from trivium.validation import load_config

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart" / "grpo_word_problems.yaml"
DECOUPLED = REPO / "examples" / "decoupled" / "grpo.yaml"


@pytest.fixture
def quickstart_two_processes(tmp_path):
    """The quickstart config with what the README's decoupled section said to add, next to its data."""
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["buffer"]["storage"] = {}
    raw["synchronizer"] = {"method": "checkpoint"}
    raw["model"]["tiny"]["corpus"] = [str(QUICKSTART.parent / p) for p in raw["model"]["tiny"]["corpus"]]
    for ts in raw["buffer"]["eval_tasksets"]:
        ts["path"] = str(QUICKSTART.parent / ts["path"])
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def problems(path, overrides):
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, check_files=False)
    return {p.path: p for p in info.value.problems}


def test_set_mode_that_the_stages_override_names_each_stage_and_the_fix(quickstart_two_processes):
    found = problems(quickstart_two_processes, ["mode=train"])
    p = found["stages[1].mode"]  # the grpo stage says mode: both; the sft stage is in mode train already
    assert "stages[0].mode" not in found
    assert p.value == "both" and "stage 'grpo' sets its own mode" in p.rule and "--set mode=train" in p.rule
    assert "examples/decoupled/grpo.yaml" in p.fix  # a decoupled run is one stage: the exact config to use
    # the sync problem of the stage as written no longer tells the user to do what they are doing
    sync = found["stages[1].synchronizer.method"]
    assert "--set mode=explore" not in sync.fix and "this stage as two processes" in sync.fix


def test_set_mode_on_a_one_stage_config_points_at_the_stage_field(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"path": "Qwen/Qwen2.5-0.5B"},
                "buffer": {"taskset": {"path": "train.jsonl"}, "storage": {}},
                "synchronizer": {"method": "checkpoint"},
                "stages": [{"name": "rl", "mode": "both"}],
            }
        )
    )
    (p,) = [p for p in problems(path, ["mode=explore"]).values() if p.path.endswith(".mode")]
    assert p.path == "stages[0].mode" and p.fix.startswith("--set stages.0.mode=explore")
    # ...and that fix works
    (stage,) = load_config(path, ["stages.0.mode=explore"]).stages
    assert stage.config.mode == "explore"


def test_a_decoupled_stage_among_other_stages_is_refused_with_the_way_out(quickstart_two_processes):
    """Both processes run every stage: the sft stage would train twice on one run folder (or, reading the
    top-level buffer.storage, wait for experiences nobody writes)."""
    found = problems(quickstart_two_processes, ["stages.1.mode=explore"])
    assert set(found) == {"stages[0].mode", "stages[1].mode"}
    assert "which the top level sets for every stage" in found["stages[0].mode"].rule
    assert "stage 'grpo' is one process of a decoupled run" in found["stages[1].mode"].rule
    assert "examples/decoupled/grpo.yaml" in found["stages[1].mode"].fix


@pytest.mark.parametrize("mode", ["explore", "train"])
def test_the_decoupled_example_is_valid_in_both_processes(mode):
    (stage,) = load_config(DECOUPLED, [f"mode={mode}"], check_files=False).stages
    cfg = stage.config
    assert cfg.mode == mode and cfg.buffer.storage is not None and cfg.synchronizer.method == "checkpoint"
    # its model is the quickstart's SFT checkpoint, where the quickstart run from the repository root puts it
    assert cfg.model.path == str(REPO / "runs/quickstart/word-problems/checkpoints/sft/step_800/model")
    assert Path(cfg.buffer.taskset.path) == QUICKSTART.parent / "data" / "train.jsonl"

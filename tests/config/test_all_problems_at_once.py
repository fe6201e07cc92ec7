"""Issue 17, item 5: ``check-config`` reports schema problems and the checks across fields together.

A field that breaks the schema (``trainer.lr: -1``) used to stop validation before the checks that need a
whole config (an unknown ``algorithm_type``, a missing file, a workflow's field names): the user fixed one
layer, ran again and met the next. Now the bad fields are dropped to their defaults for those checks.
"""

import json
from pathlib import Path

import pytest

from trivium.cli import main as cli
from trivium.config import ConfigError
from trivium.validation import load_config, validate_raw

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart" / "grpo_word_problems.yaml"
ROW = {"question": "1+1?", "answer": "#### 2"}


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps(ROW) + "\n")
    return tmp_path


def base(**over):
    return {"model": {"path": "Qwen/Qwen2.5-0.5B"}, "buffer": {"taskset": {"path": "train.jsonl"}}, **over}


def problems(raw, folder):
    with pytest.raises(ConfigError) as info:
        validate_raw(raw, folder)
    return info.value


def test_the_issues_example_wrong_algorithm_and_wrong_lr_both_reported():
    """The issue's report: a wrong algorithm_type and a wrong lr gave only lr."""
    with pytest.raises(ConfigError) as info:
        load_config(
            QUICKSTART, ["trainer.lr=-1", "stages.1.algorithm.algorithm_type=grpoo"], check_files=False
        )
    by_path = {p.path: p for p in info.value.problems}
    assert set(by_path) == {"trainer.lr", "stages[1].algorithm.algorithm_type"}
    assert "greater than 0" in by_path["trainer.lr"].rule
    assert "did you mean 'grpo'?" in by_path["stages[1].algorithm.algorithm_type"].fix
    assert "2 problems found" in str(info.value)
    assert "ran with the fields that break the schema at their defaults" in str(info.value)


def test_schema_and_cross_field_problems_of_one_section_and_of_others(folder):
    raw = base(trainer={"lr": "fast"}, algorithm={"algorithm_type": "grpoo"})
    raw["buffer"]["taskset"].update(
        {"reward_fn": "math_verfy", "fields": {"questoin": "q"}, "repeat_times": 0}
    )
    err = problems(raw, folder)
    by_path = {p.path: p for p in err.problems}
    assert set(by_path) == {
        "trainer.lr",  # schema: not a number
        "buffer.taskset.repeat_times",  # schema: below 1
        "algorithm.algorithm_type",  # registry
        "buffer.taskset.reward_fn",  # registry
        "buffer.taskset.fields.questoin",  # the workflow's fields
    }


def test_a_check_that_used_a_default_says_so(folder):
    """repeat_times broke the schema, so the mini-batch check ran with its default (8): 16 tasks x 8 = 128,
    which 3 does not divide. Reported, with the batch it used, under a header that says defaults were used."""
    raw = base(trainer={"mini_batch_size": 3})
    raw["buffer"]["taskset"]["repeat_times"] = 0
    err = problems(raw, folder)
    by_path = {p.path: p for p in err.problems}
    assert set(by_path) == {"buffer.taskset.repeat_times", "trainer.mini_batch_size"}
    assert "= 128" in by_path["trainer.mini_batch_size"].rule
    assert "at their defaults" in str(err).splitlines()[0]


def test_a_dropped_field_is_not_reported_again_by_a_check_that_saw_its_default(folder):
    """buffer.taskset of the wrong type: one problem there, not also 'mode both explores tasks: set it'."""
    err = problems(base(buffer={"taskset": "train.jsonl"}), folder)
    assert [p.path for p in err.problems] == ["buffer.taskset"]


def test_stage_problems_of_both_kinds(folder):
    raw = base(
        stages=[
            {"name": "a", "trainer": {"lr": 0}},
            {"name": "b", "algorithm": {"algorithm_type": "rlooo"}, "explorer": {"eval_intervall": 1}},
        ]
    )
    err = problems(raw, folder)
    assert {p.path for p in err.problems} == {
        "stages[0].trainer.lr",
        "stages[1].algorithm.algorithm_type",
        "stages[1].explorer.eval_intervall",
    }


def test_a_config_whose_stages_are_malformed_still_reports_without_guessing(folder):
    err = problems(base(stages=[1], trainer={"lr": -1}), folder)
    assert {p.path for p in err.problems} == {"stages[0]", "trainer.lr"}


def test_check_config_lists_fields_checks_and_data_rows_in_one_report(folder, capsys):
    (folder / "train.jsonl").write_text("null\n" + json.dumps(ROW) + "\n")
    (folder / "c.yaml").write_text(
        "model: {path: Qwen/Qwen2.5-0.5B}\n"
        "algorithm: {algorithm_type: grpoo}\n"
        "trainer: {lr: -1}\n"
        "buffer: {taskset: {path: train.jsonl}}\n"
    )
    code = cli(["check-config", str(folder / "c.yaml")])
    err = capsys.readouterr().err
    assert code == 2
    assert "3 problems found" in err
    assert "trainer.lr = -1" in err  # schema
    assert "algorithm.algorithm_type = 'grpoo'" in err  # registry
    assert "buffer.taskset.path" in err and "row 0 (line 1) is a JSON null" in err  # the data file's rows

"""A row whose prompt fills the model's context costs its own task, never the run (issue 26 item 1).

Before: check_prompts refused the whole engine batch, so every task batched with one over-long row
failed, the step raised "every task of the batch failed", and the final evaluation (run before the
last checkpoint) lost the trained steps. Now the task set's ``on_long_row`` decides per row (skip and
count, truncate, or stop naming the row), and an evaluation that raises comes after the step's checkpoint.
"""

import json

import pytest
import yaml
from tests.launch.helpers import tiny_run_config

from trivium.cli import main as cli
from trivium.models.handle import ModelHandle, PromptTooLong
from trivium.models.protocol import SamplingParams
from trivium.monitor.metrics import read_metrics

LONG = {"question": "Tom has 12 apples and Tom gets 3 more apples. " * 80 + "How many?", "answer": "15"}


def tasks(folder, data_dir, name, long_at=0, n=4):
    rows = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()[:n]]
    rows.insert(long_at, LONG)
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run(folder, model_dir, data_dir, name, *, train=None, evaluate=None):
    cfg = {
        **tiny_run_config(folder, model_dir, "long", name, max_tokens=4),
        "buffer": {
            "batch_size": 2,
            "total_steps": 2,
            "taskset": {
                "path": str(data_dir / "train.jsonl"),
                "repeat_times": 2,
                "shuffle": False,
                **(train or {}),
            },
            "eval_tasksets": [{"path": tasks(folder, data_dir, "eval"), "name": "ev", **(evaluate or {})}],
        },
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return cli(["run", "-c", str(path)]), folder / "runs" / "long" / name


@pytest.mark.integration
def test_a_row_longer_than_the_context_is_skipped_and_counted_and_its_batch_goes_on(
    tmp_path, tiny_model_dir, word_problem_dir
):
    train = {"path": tasks(tmp_path, word_problem_dir, "train")}  # the long row is the first task of step 1
    code, run_dir = run(tmp_path, tiny_model_dir, word_problem_dir, "skip", train=train)
    assert code == 0
    first, last = read_metrics(run_dir)
    assert first["rollout/skipped_long_tasks"] == 1 and first["rollout/failed_tasks"] == 0
    assert first["rollout/experiences"] == 2  # the other task of the batch: its 2 samples
    assert last["rollout/skipped_long_tasks"] == 0
    assert last["eval/ev/skipped_long_tasks"] == 1 and last["eval/ev/count"] == 4  # the 4 short rows


@pytest.mark.integration
def test_truncate_cuts_the_prompt_and_samples(tmp_path, tiny_model_dir, word_problem_dir):
    train = {"path": tasks(tmp_path, word_problem_dir, "train"), "on_long_row": "truncate"}
    code, run_dir = run(tmp_path, tiny_model_dir, word_problem_dir, "truncate", train=train)
    assert code == 0
    first = read_metrics(run_dir)[0]
    assert first["rollout/truncated_prompts"] == 1 and first["rollout/skipped_long_tasks"] == 0
    assert first["rollout/experiences"] == 4  # both tasks sampled


@pytest.mark.integration
def test_error_names_the_row_and_a_failing_final_eval_keeps_the_trained_steps(
    tmp_path, tiny_model_dir, word_problem_dir, caplog
):
    code, run_dir = run(
        tmp_path, tiny_model_dir, word_problem_dir, "error", evaluate={"on_long_row": "error"}
    )
    err = caplog.text
    assert code == 1
    assert "task set 'ev' row 0" in err and "on_long_row: error" in err and "context is 512" in err
    assert "evaluation after step 2" in err and "run the same command again" in err
    # the checkpoint of the last step came before the evaluation that failed
    assert (run_dir / "checkpoints" / "main" / "step_2" / "meta.json").exists()
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]


class _Engine:
    max_length = 10
    tokenizer = None

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, params):
        self.prompts += prompts
        return [[] for _ in prompts]


def test_the_handle_refuses_or_truncates_a_prompt_that_fills_the_context():
    engine = _Engine()
    params = SamplingParams(n=1, max_tokens=3)
    with pytest.raises(PromptTooLong, match="12 tokens and the model's context is 10"):
        ModelHandle(engine, params, on_long_prompt="skip").generate(list(range(12)))
    handle = ModelHandle(engine, params, on_long_prompt="truncate")
    handle.generate(list(range(12)))
    handle.generate(list(range(5)))
    assert engine.prompts == [list(range(5, 12)), list(range(5))]  # the last 10 - min(3, 5) = 7 tokens
    assert handle.truncated_prompts == 1


def test_check_config_names_the_long_rows_of_a_task_set_that_errors_on_them(
    tmp_path, tiny_model_dir, word_problem_dir, capsys
):
    cfg = {
        **tiny_run_config(tmp_path, tiny_model_dir, "long", "check"),
        "buffer": {
            "batch_size": 2,
            "total_steps": 1,
            "taskset": {"path": str(word_problem_dir / "train.jsonl")},
            "eval_tasksets": [
                {"path": tasks(tmp_path, word_problem_dir, "eval", long_at=2), "on_long_row": "error"}
            ],
        },
    }
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "buffer.eval_tasksets[0].on_long_row" in err and "row 2 (1288 tokens)" in err and "512" in err
    cfg["buffer"]["eval_tasksets"][0]["on_long_row"] = "skip"  # the run counts and drops it: no problem
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["check-config", str(path)]) == 0


class _TinyEngine(_Engine):
    def __init__(self, tokenizer, max_length):
        super().__init__()
        self.tokenizer, self.max_length = tokenizer, max_length


@pytest.fixture
def tokenised_lengths(monkeypatch, tiny_model_dir):
    """The tiny model's tokenizer, and the lengths of the texts it is asked to tokenise."""
    from trivium.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    seen: list[int] = []
    call = type(tokenizer).__call__

    def spy(self, text, *args, **kwargs):
        seen.append(len(text))
        return call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", spy)
    return tokenizer, seen


def test_a_huge_row_is_refused_or_cut_before_it_is_tokenised(tokenised_lengths):
    """Issue 26 item 1: a 50 MB row cost ~97 s of tokenising before its length was known. Text longer than
    the context can hold with any of the tokenizer's tokens is refused (or cut, for truncate) first."""
    from trivium.models.chat import char_budget, render_ids

    tokenizer, seen = tokenised_lengths
    params = SamplingParams(n=1, max_tokens=3)
    huge = [{"role": "user", "content": "Tom has 3 apples. " * 500_000}]  # 9 M characters
    with pytest.raises(PromptTooLong, match=r"9000000 characters \(at least 512 tokens\).*context is 512"):
        ModelHandle(_TinyEngine(tokenizer, 512), params, on_long_prompt="skip").chat(huge)
    assert seen == []  # refused without tokenising
    engine = _TinyEngine(tokenizer, 512)
    handle = ModelHandle(engine, params, on_long_prompt="truncate")
    handle.chat(huge)
    assert max(seen) < 2 * char_budget(tokenizer, 512) and handle.truncated_prompts == 1
    # the cut text gives the same prompt as cutting the tokens of the whole text
    over = [{"role": "user", "content": "Tom has 3 apples. " * (char_budget(tokenizer, 512) // 18 + 40)}]
    handle.chat(over)
    whole = render_ids(tokenizer, over, True)
    assert engine.prompts[1] == whole[-len(engine.prompts[1]) :] and len(engine.prompts[1]) == 512 - 3
    assert engine.prompts[0] == engine.prompts[1]  # same tail text, same last tokens


def test_check_config_names_a_huge_row_without_tokenising_it(
    tmp_path, tiny_model_dir, word_problem_dir, capsys
):
    huge = tmp_path / "huge.jsonl"
    huge.write_text(json.dumps({"question": "Tom has 3 apples. " * 500_000, "answer": "3"}) + "\n")
    cfg = {
        **tiny_run_config(tmp_path, tiny_model_dir, "long", "huge"),
        "buffer": {
            "batch_size": 2,
            "total_steps": 1,
            "taskset": {"path": str(word_problem_dir / "train.jsonl")},
            "eval_tasksets": [{"path": str(huge), "on_long_row": "error"}],
        },
    }
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "row 0 (over" in err and "characters, so at least 512 tokens)" in err

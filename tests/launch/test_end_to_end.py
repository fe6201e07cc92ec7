"""End to end through `trivium run`: SFT then GRPO on a task made for the test; reward must go up.

The task: each prompt names one of eight words; the right answer is a digit fixed per word. The SFT
demonstrations come from a teacher that writes the wrong digit for half the rows, so the SFT model is
right about half the time; the exact-answer reward then lets GRPO find the right digit for each word.
"""

import json
import random

import pytest
import yaml

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "candle"]


def write_task(folder, seed=0):
    rng = random.Random(seed)
    right = {w: rng.randrange(10) for w in WORDS}
    wrong = {w: (right[w] + 1 + rng.randrange(9)) % 10 for w in WORDS}
    rows = lambda n: [rng.choice(WORDS) for _ in range(n)]  # noqa: E731
    task = [{"question": f"Code for {w}?", "answer": f"#### {right[w]}"} for w in rows(256)]
    # exactly half of each word's demonstrations are wrong
    sft = [
        {"question": f"Code for {w}?", "answer": f"#### {(right if (i // 8) % 2 else wrong)[w]}"}
        for i, w in enumerate(WORDS * 64)
    ]
    rng.shuffle(sft)
    for name, data in (("train", task), ("test", task[:64]), ("sft", sft)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))


def config(folder, grpo_steps=40):
    return {
        "project": "e2e",
        "name": "codes",
        "checkpoint_root": str(folder / "runs"),
        "model": {
            "tiny": {
                "corpus": ["train.jsonl", "sft.jsonl"],
                "hidden_size": 64,
                "num_layers": 2,
                "num_heads": 2,
                "num_kv_heads": 1,
                "intermediate_size": 128,
                "vocab_size": 300,
            }
        },
        "explorer": {"rollout": {"max_tokens": 8}, "eval_interval": 0},
        "buffer": {"eval_tasksets": [{"path": "test.jsonl", "name": "test"}]},
        "monitor": {"progress_bar": False},
        "stages": [
            {
                "name": "sft",
                "mode": "train",
                "algorithm": {"algorithm_type": "sft"},
                "buffer": {
                    "batch_size": 32,
                    "total_steps": 150,
                    "sft_dataset": {
                        "path": "sft.jsonl",
                        "fields": {"prompt": "question", "response": "answer"},
                    },
                },
                "trainer": {"lr": 3e-3, "warmup_steps": 5},
                "explorer": {"eval_at_start": False},
            },
            {
                "name": "grpo",
                "mode": "both",
                "buffer": {
                    "batch_size": 8,
                    "total_steps": grpo_steps,
                    "taskset": {"path": "train.jsonl", "repeat_times": 8},
                },
                "trainer": {"lr": 1e-3},
                "explorer": {"eval_at_start": False},
            },
        ],
    }


@pytest.mark.integration
def test_sft_then_grpo_reward_goes_up(tmp_path):
    write_task(tmp_path)
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(config(tmp_path)))
    assert cli(["run", "--config", str(cfg_path)]) == 0
    run_dir = tmp_path / "runs" / "e2e" / "codes"
    records = read_metrics(run_dir)
    grpo = [r for r in records if r["stage"] == "grpo"]
    rewards = [r["rollout/reward_mean"] for r in grpo]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.15, f"reward did not go up: {rewards}"
    sft_acc = [r["eval/test/accuracy"] for r in records if r["stage"] == "sft" and "eval/test/accuracy" in r]
    end_acc = grpo[-1]["eval/test/accuracy"]
    assert end_acc > sft_acc[-1], (sft_acc, end_acc)
    # every step logged the rollout/trainer mismatch, and the final checkpoints are complete
    assert all("mismatch/logprob_abs_max" in r for r in grpo)
    assert (run_dir / "checkpoints" / "grpo" / "step_40" / "model" / "model.safetensors").exists()
    assert cli(["plot", str(run_dir)]) == 0
    assert (run_dir / "curves.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.integration
def test_seeded_runs_are_reproducible(tmp_path):
    """Two runs of the same config produce the same metrics, step for step (timings aside)."""
    write_task(tmp_path)
    curves = []
    for name in ("a", "b"):
        cfg = config(tmp_path, grpo_steps=8)
        cfg["name"] = name
        cfg_path = tmp_path / f"{name}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        assert cli(["run", "--config", str(cfg_path)]) == 0
        records = read_metrics(tmp_path / "runs" / "e2e" / name)
        curves.append(
            [
                {k: v for k, v in r.items() if "seconds" not in k and "per_s" not in k and k != "time"}
                for r in records
            ]
        )
    assert curves[0] == curves[1]


def test_bad_row_in_a_later_stage_fails_before_training(tmp_path, capsys):
    write_task(tmp_path)
    with (tmp_path / "train.jsonl").open("a") as f:
        f.write(json.dumps({"question": "   ", "answer": "#### 1"}) + "\n")
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(config(tmp_path)))
    assert cli(["run", "--config", str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert "train.jsonl" in err and "question" in err and "257" in err  # file, field, line
    assert "on_bad_row" in err  # and what to do
    assert not (tmp_path / "runs" / "e2e" / "codes" / "base_model").exists()  # no model was made

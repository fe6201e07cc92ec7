"""The Learn-to-Ask recipe end to end, shrunk (benchmarks/recipe_ask.py's configs): SFT on the logged
dialogues, then GRPO on single turns of the logs (dialogue workflow, ask reward), then GRPO over episodes
with the simulated user. Checks the plumbing; learning is the benchmark's job (docs/recipes.md)."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics
from trivium.tasks.ask import write_ask

REPO = Path(__file__).resolve().parents[2]


def recipe():
    spec = importlib.util.spec_from_file_location("recipe_ask", REPO / "benchmarks" / "recipe_ask.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_logs_sft_then_learn_to_ask_then_online_grpo_run_without_failures(tmp_path):
    r = recipe()
    data = tmp_path / "ask-data"
    write_ask(data, n_train=16, n_test=4, n_logs=48)
    cfg = r.base_config(data)
    cfg["checkpoint_root"] = str(tmp_path / "runs")
    cfg["model"]["tiny"].update(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    cfg["explorer"]["eval_interval"] = 0
    (sft,) = cfg["stages"]
    sft["buffer"].update(total_steps=3, batch_size=8)
    sft["trainer"].update(micro_batch_size=8, warmup_steps=1)
    for name, change in r.variants().items():
        taskset = {**change["taskset"], "path": str(data / change["taskset"]["path"]), "repeat_times": 2}
        cfg["stages"].append(
            {"name": name, "mode": "both", "algorithm": change["algorithm"],
             "buffer": {"batch_size": 2, "total_steps": 2, "taskset": taskset}}
        )  # fmt: skip
    path = tmp_path / "ask.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 0
    run_dir = tmp_path / "runs" / r.PROJECT / "ask-sft"
    records = read_metrics(run_dir)
    by_stage = {s: [x for x in records if x["stage"] == s and "train/loss" in x] for s in r.variants()}
    assert all(len(steps) == 2 for steps in by_stage.values())
    offline, online = by_stage["learn_to_ask"], by_stage["online_grpo"]
    assert all("rollout/decision" in x and x["rollout/failed_tasks"] == 0 for x in offline)  # the ask reward
    assert all(
        "rollout/asked_first" in x and x["rollout/failed_tasks"] == 0 for x in online
    )  # the user's info
    assert any("eval/test/success" in x for x in records if x["stage"] == "online_grpo")
    assert not (run_dir / "failures.jsonl").exists()

"""examples/countdown: the shipped data is what make_data.py writes, and the config runs end to end
(shortened) with the countdown workflow and reward, their metrics in the run's metrics.jsonl."""

import shutil
from pathlib import Path

import pytest
import yaml

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics
from trivium.tasks.countdown import write_countdown

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "countdown"


def test_the_shipped_data_is_what_make_data_writes(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("countdown_make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its SETTINGS, without running its __main__ block
    paths = write_countdown(tmp_path, seed=0, n_train=3000, n_sft=3000, **module.SETTINGS)
    for split, path in paths.items():
        assert path.read_bytes() == (EXAMPLE / "data" / f"{split}.jsonl").read_bytes(), split


@pytest.mark.integration
def test_the_example_runs_with_the_countdown_reward(tmp_path):
    cfg = yaml.safe_load((EXAMPLE / "countdown.yaml").read_text())
    cfg["checkpoint_root"] = str(tmp_path / "runs")
    cfg["monitor"] = {"progress_bar": False}
    cfg["model"]["tiny"].update(hidden_size=32, num_layers=1, intermediate_size=64)
    cfg["stages"][0]["buffer"]["total_steps"] = 2
    cfg["stages"][1]["buffer"].update(total_steps=2, batch_size=2)
    cfg["stages"][1]["buffer"]["taskset"]["repeat_times"] = 2
    cfg["stages"][1]["trainer"]["micro_batch_size"] = 4
    cfg["buffer"]["eval_tasksets"][0]["max_rows"] = 8
    # a copy of the example folder, the config next to its data as the user's is (examples/ stays untouched)
    folder = shutil.copytree(EXAMPLE, tmp_path / "countdown")
    path = folder / "test_countdown_run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 0
    records = [r for r in read_metrics(tmp_path / "runs" / "countdown" / "countdown") if r["stage"] == "grpo"]
    last = records[-1]
    assert last["rollout/count"] == 4 and last["rollout/count/reward_error"] == 0
    assert {"rollout/valid_numbers", "rollout/format", "eval/test/accuracy"} <= set(last)
    numbers = {k: v for k, v in last.items() if k != "stage"}
    bad = {k: v for k, v in numbers.items() if type(v) not in (int, float)}
    assert not bad, bad  # every metric a plain number (no tensors, numpy scalars, None or NaN strings)

"""The agent examples' configs through `trivium run`, shrunk: SFT on multi-turn demonstrations, then GRPO
over multi-turn episodes (FrozenLake with `multi_turn`, the calculator with `react`, FrozenLake with
`step_wise` + `step_wise_grpo`). Checks the plumbing end to end; learning is the benchmark's job
(benchmarks/agents.py)."""

from pathlib import Path

import pytest
import yaml

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics
from trivium.tasks.agent_tasks import write_calculator, write_frozenlake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def shrunk(task: str, folder: Path, **stage1) -> Path:
    cfg = yaml.safe_load((EXAMPLES / f"{task}.yaml").read_text())
    cfg["checkpoint_root"] = str(folder / "runs")
    cfg["monitor"] = {"progress_bar": False}
    cfg["model"]["tiny"].update(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    cfg["explorer"]["eval_interval"] = 0
    cfg["buffer"]["eval_tasksets"][0]["max_rows"] = 4
    sft, grpo = cfg["stages"]
    sft["buffer"].update(total_steps=3, batch_size=8)
    sft["trainer"].update(micro_batch_size=8, warmup_steps=1)
    grpo["buffer"].update(total_steps=2, batch_size=2)
    grpo["buffer"]["taskset"].update(repeat_times=2, **stage1.pop("taskset", {}))
    grpo.update(stage1)
    path = folder / f"{task}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agents")
    write_calculator(folder / "data" / "calculator", n_train=16, n_test=4, n_sft=32)
    write_frozenlake(folder / "data" / "frozenlake", n_train=16, n_test=4, n_sft=32)
    return folder


@pytest.mark.integration
@pytest.mark.parametrize(
    ("task", "metric", "changes"),
    [
        ("frozenlake", "eval/test/success", {}),
        ("calculator", "eval/test/accuracy", {}),
        (
            "frozenlake",
            "eval/test/success",
            {"taskset": {"workflow": "step_wise"}, "algorithm": {"algorithm_type": "step_wise_grpo"}},
        ),
        (
            "frozenlake",
            "eval/test/success",
            {"taskset": {"workflow": "step_wise"}, "algorithm": {"algorithm_type": "gigpo"}},
        ),
        (
            "frozenlake",
            "eval/test/success",
            {
                "taskset": {
                    "workflow": "reflect_retry",
                    "workflow_args": {"env": "frozenlake", "max_turns": 8, "candidates": 8},
                },
                "algorithm": {"algorithm_type": "step_wise_grpo", "advantage_args": {"positive_scale": 2.0}},
            },
        ),
    ],
    ids=[
        "frozenlake-multi_turn",
        "calculator-react",
        "frozenlake-step_wise",
        "frozenlake-gigpo",
        "frozenlake-reflect_retry",
    ],
)
def test_agent_config_plumbing_sft_then_grpo_episodes_run_without_failures(data, task, metric, changes):
    workflow = changes.get("taskset", {}).get("workflow")
    name = "-".join([task, *([workflow, changes["algorithm"]["algorithm_type"]] if changes else [])])
    folder = data / name
    folder.mkdir()
    (folder / "data").symlink_to(data / "data")
    assert cli(["run", "--config", str(shrunk(task, folder, **changes))]) == 0
    run_dir = folder / "runs" / "agents" / task
    records = read_metrics(run_dir)
    grpo = [r for r in records if r["stage"] == "grpo"]
    assert len(grpo) == 2
    assert all(r["rollout/turns"] >= 1 and r["rollout/failed_tasks"] == 0 for r in grpo)
    assert metric in grpo[-1]
    sft_evals = [r for r in records if r["stage"] == "sft" and metric in r]
    assert sft_evals, "the SFT stage evaluated the agent on the test maps/questions"
    assert not (run_dir / "failures.jsonl").exists(), (run_dir / "failures.jsonl").read_text()
    if workflow == "reflect_retry":  # failed episodes diagnosed; each retry made is one more episode
        assert all(r["rollout/reflect/failed"] > 0 for r in grpo)  # a 3-step SFT model fails its maps
        made = [r for r in grpo if r["rollout/reflect/retried"] > 0]
        assert made, "no failed episode was retried"
        assert all(r["advantage/episodes"] > 2 * 2 and "rollout/retry/turns" in r for r in made)
    elif changes:  # step-wise: more experiences than episodes, each episode's turns share a run index
        last = grpo[-1]
        assert last["advantage/episodes"] == 2 * 2  # 2 tasks x 2 episodes, each counted once
        assert last["rollout/experiences"] == last["advantage/episodes"] * last["advantage/turns_per_episode"]
        assert last["rollout/experiences"] >= 2 * 2
    if changes.get("algorithm", {}).get("algorithm_type") == "gigpo":  # both episodes of a task start at S
        assert all(r["gigpo/anchor_groups"] >= 2 for r in grpo)

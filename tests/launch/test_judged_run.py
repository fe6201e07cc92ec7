"""End to end through `trivium run`, where a judge behind an OpenAI-compatible URL gives the only reward: the
rubric reward asks a deterministic judge (tests/rewards/judge_server.py) whether each answer meets the
task's one rubric item, "the answer is exactly the right code", and the policy's judged score rises over
GRPO, and so does its greedy accuracy by the rule-based check of the eval set.

The judge is strict on purpose: with a lenient one ("the answer contains the code") the policy learned to
pad its answers to the token limit around the code; its judged score rose from 0.54 to 0.72 while its greedy
accuracy fell from 0.70 to 0.00 (reward hacking, measured on this task; docs/rewards.md)."""

import json

import pytest
import yaml
from tests.rewards.judge_server import KEY, Judge, serving

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics


@pytest.mark.slow
@pytest.mark.integration
def test_a_rubric_judge_as_the_only_reward_and_the_judged_score_rises(e2e, tmp_path, monkeypatch):
    e2e.write(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    for row in rows:  # the rubric: one item, the right code ("#### 7"), judged yes if the answer holds it;
        # a "rubric" column reaches the reward unmapped (the reward declares the field)
        row["rubric"] = [row["answer"]]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", KEY)
    with serving(Judge(delay=0.0, strict=True)) as judge:
        cfg = e2e.config(tmp_path, grpo_steps=30)
        cfg["stages"][1]["buffer"]["taskset"].update(
            reward_fn="rubric",
            reward_args={"url": judge.url, "api_key_env": "JUDGE_KEY_FOR_TEST"},
        )
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
        assert cli(["run", "--config", str(tmp_path / "run.yaml")]) == 0
    records = read_metrics(tmp_path / "runs" / "e2e" / "codes")
    grpo = [r for r in records if r["stage"] == "grpo"]
    judged = [r["rollout/judge_score"] for r in grpo]
    assert all(r["rollout/reward_mean"] == pytest.approx(r["rollout/judge_score"]) for r in grpo)
    first, last = sum(judged[:4]) / 4, sum(judged[-4:]) / 4
    assert last > first + 0.15, f"the judged score did not rise: {judged}"
    assert all(r["rollout/count/judge_unparsable"] == 0.0 for r in grpo)
    accuracy = [r["eval/test/accuracy"] for r in records if "eval/test/accuracy" in r]  # SFT end, GRPO end
    assert accuracy[-1] > accuracy[0], f"greedy accuracy did not follow the judged score: {accuracy}"
    rubric_calls = [c for c in judge.calls if "criterion: " in c]
    assert 0 < len(rubric_calls) < 30 * 64  # served from the cache for repeated (question, answer) pairs

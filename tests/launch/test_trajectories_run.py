"""monitor.trajectories through `trivium run`: every recorded token's rollout log-prob, trainer log-prob at
the same weights, entropy, advantage and mask; a resumed stage records each step once."""

import json
import statistics

import pytest
import yaml

from trivium.cli import main as cli
from trivium.monitor.trajectories import read_trajectories


def _run(e2e, tmp_path, grpo_steps=3, every=1, per_step=64, share_prompts="auto"):
    e2e.write(tmp_path)
    cfg = e2e.config(tmp_path, grpo_steps=grpo_steps)
    cfg["stages"][1].setdefault("trainer", {})["share_prompts"] = share_prompts
    cfg["stages"][0]["buffer"]["total_steps"] = 5
    cfg["monitor"]["trajectories"] = {"every": every, "per_step": per_step}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 0
    return tmp_path / "runs" / "e2e" / "codes"


@pytest.mark.integration
@pytest.mark.parametrize("share_prompts", [False, True])
def test_every_token_of_the_recorded_samples_carries_its_numbers(e2e, tmp_path, share_prompts):
    run_dir = _run(e2e, tmp_path, share_prompts=share_prompts)
    grpo = [m for m in map(json.loads, (run_dir / "metrics.jsonl").open()) if m.get("stage") == "grpo"]
    shared = [m.get("train/shared_prompt", 0.0) for m in grpo if "train/loss" in m]
    assert shared == [float(share_prompts)] * 3  # each prompt's 8 samples in one row, or a row each
    records = read_trajectories(run_dir)
    assert [r["step"] for r in records] == [s for s in (1, 2, 3) for _ in range(64)]  # every sample of 8 x 8
    assert {r["stage"] for r in records} == {"grpo"} and records[0]["global_step"] == 6
    for r in records:
        n = len(r["response_ids"])
        assert n >= 1 and all(
            len(r[k]) == n
            for k in ("response_text", "mask", "logprob", "trainer_logprob", "entropy", "advantage")
        )
        assert len(r["prompt_ids"]) == len(r["prompt_text"]) > 0
        assert all(e > 0 for e, m in zip(r["entropy"], r["mask"]) if m)
        # on-policy, fp32 rollouts: the trainer's log-probs at the sampling weights equal the engine's
        assert max(abs(a - b) for a, b in zip(r["logprob"], r["trainer_logprob"])) < 1e-3
    # GRPO's advantage, derived from the recorded group's rewards: (r - mean) / (unbiased std + 1e-6), 0 for
    # a group whose rewards are all equal; the same on every action token of the sequence
    for step in (1, 2, 3):
        groups = {}
        for r in records:
            if r["step"] == step:
                groups.setdefault(r["group_id"], []).append(r)
        assert len(groups) == 8
        for members in groups.values():
            rewards = [m["reward"] for m in members]
            mean, std = statistics.mean(rewards), statistics.stdev(rewards)
            for m in members:
                want = 0.0 if len(set(rewards)) == 1 else (m["reward"] - mean) / (std + 1e-6)
                got = {a for a, k in zip(m["advantage"], m["mask"]) if k}
                assert len(got) == 1 and abs(got.pop() - want) < 1e-4, (m["reward"], rewards, m["advantage"])


@pytest.mark.integration
@pytest.mark.slow
def test_few_samples_every_other_step_two_of_a_group_groups_spread(e2e, tmp_path):
    records = read_trajectories(_run(e2e, tmp_path, grpo_steps=4, every=2, per_step=6))
    assert [r["step"] for r in records] == [2] * 6 + [4] * 6
    step2 = [r for r in records if r["step"] == 2]
    groups = sorted({r["group_id"] for r in step2})
    assert len(groups) == 3 and groups[-1] - groups[0] == 7  # the first, a middle and the last of 8 groups
    assert all(sum(r["group_id"] == g for r in step2) == 2 for g in groups)
    assert all(r["messages"][-1]["role"] == "user" and r["response"] is not None for r in records)

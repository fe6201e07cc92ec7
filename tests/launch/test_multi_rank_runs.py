"""trivium run with trainer.strategy ddp / fsdp2: rank processes started for a stage and kept for the next one
that trains on ranks like them (training it as new ones do), sharded checkpoints, a killed rank ending the
run with a message, and a rerun resuming it."""

import json

import pytest
import torch
import yaml
from tests.launch.helpers import assert_same_records, trivium_run

from trivium.monitor.metrics import read_metrics


def make_config(e2e, folder, name, strategy, world_size, sft_steps=4, grpo_steps=2):
    cfg = e2e.config(folder, grpo_steps=grpo_steps)
    cfg["name"] = name
    cfg["synchronizer"] = {"wait_timeout_s": 60}
    cfg["stages"][0]["buffer"]["total_steps"] = sft_steps
    for stage in cfg["stages"]:
        stage["trainer"].update({"strategy": strategy, "world_size": world_size, "save_interval": 2})
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.integration
def test_fsdp2_run_shards_checkpoints_and_hands_plain_weights_to_the_next_stage(e2e, tmp_path):
    e2e.write(tmp_path)
    result = trivium_run(make_config(e2e, tmp_path, "fsdp2", "fsdp2", 2))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("strategy fsdp2 on 2 rank(s)") == 1  # started once, for both stages:
    assert "stage grpo trains on the rank process(es) of the stage before" in result.stderr
    run_dir = tmp_path / "runs" / "e2e" / "fsdp2"
    for stage, step in (("sft", 4), ("grpo", 2)):
        folder = run_dir / "checkpoints" / stage / f"step_{step}"
        meta = json.loads((folder / "meta.json").read_text())
        assert (meta["strategy"], meta["world_size"]) == ("fsdp2", 2)
        assert (folder / "model" / "model.safetensors").exists()  # consolidated by rank 0
        assert len(list((folder / "dcp").glob("*.distcp"))) == 2  # one shard file per rank
    stages = [(r["stage"], r["step"]) for r in read_metrics(run_dir) if "train/loss" in r]
    assert stages == [("sft", 1), ("sft", 2), ("sft", 3), ("sft", 4), ("grpo", 1), ("grpo", 2)]
    # trivium convert assembles the shards in one process: the same weights as the consolidated folder
    from transformers import AutoModelForCausalLM

    from trivium.cli import main as cli

    checkpoint = run_dir / "checkpoints" / "grpo" / "step_2"
    assert (
        cli(
            [
                "convert",
                str(checkpoint),
                str(tmp_path / "from-shards"),
                "--from-shards",
                "--dtype",
                "bfloat16",
            ]
        )
        == 0
    )
    shards = AutoModelForCausalLM.from_pretrained(tmp_path / "from-shards").state_dict()
    full = AutoModelForCausalLM.from_pretrained(checkpoint / "model").state_dict()
    assert shards.keys() == full.keys() and all(shards[k].dtype is torch.bfloat16 for k in shards)
    assert all(torch.equal(shards[k], full[k].bfloat16()) for k in full)


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_rank_stops_the_run_and_a_rerun_resumes_it_exactly(e2e, tmp_path):
    e2e.write(tmp_path)
    reference_path = make_config(e2e, tmp_path, "reference", "ddp", 2, grpo_steps=1)
    cfg = yaml.safe_load(reference_path.read_text())
    cfg["stages"][1]["synchronizer"] = {"wait_timeout_s": 61}  # unlike the SFT stage's ranks: new ones
    reference_path.write_text(yaml.safe_dump(cfg))
    reference = trivium_run(reference_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert reference.stderr.count("strategy ddp on 2 rank(s)") == 2, reference.stderr[-3000:]
    path = make_config(e2e, tmp_path, "killed", "ddp", 2, grpo_steps=1)
    killed = trivium_run(path, "rank1:train:3")  # rank 1 dies before SFT step 3 (checkpoint at step 2)
    assert killed.returncode == 1, killed.stderr[-3000:]
    assert "trainer rank 1" in killed.stderr and "killed by SIGKILL" in killed.stderr
    assert "Run the same command again to resume" in killed.stderr
    resumed = trivium_run(path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "step_2" in resumed.stderr
    assert resumed.stderr.count("strategy ddp on 2 rank(s)") == 1  # GRPO on the SFT stage's ranks
    assert "stage grpo trains on the rank process(es) of the stage before" in resumed.stderr
    got = read_metrics(tmp_path / "runs" / "e2e" / "killed")
    ref = read_metrics(tmp_path / "runs" / "e2e" / "reference")
    assert_same_records(got, ref)  # resumed exactly, and kept ranks train the GRPO stage as new ones do


def lora_config(e2e, folder, name, strategy="single", world_size=1):
    path = make_config(e2e, folder, name, strategy, world_size, grpo_steps=2)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["lora"] = {"rank": 8, "alpha": 16}
    cfg["stages"][1]["algorithm"] = {"kl_loss": {"coef": 0.05}}  # the reference: the base, adapters off
    cfg["stages"].append(
        {"name": "bench", "mode": "bench", "trainer": {"strategy": "single", "world_size": 1}}
    )
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.integration
def test_lora_stages_checkpoint_adapters_resume_exactly_and_bench_merged(e2e, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    e2e.write(tmp_path)
    reference = trivium_run(lora_config(e2e, tmp_path, "lora-reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert "LoRA rank 8 on all-linear" in reference.stderr
    path = lora_config(e2e, tmp_path, "lora")
    assert trivium_run(path, "train:3").returncode == -9  # killed in SFT step 3 (checkpoint at 2)
    resumed = trivium_run(path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run_dir = tmp_path / "runs" / "e2e" / "lora"
    assert_same_records(read_metrics(run_dir), read_metrics(tmp_path / "runs" / "e2e" / "lora-reference"))
    adapter = run_dir / "checkpoints" / "grpo" / "step_2" / "model"
    assert (adapter / "adapter_config.json").exists() and not (adapter / "model.safetensors").exists()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(run_dir / "base_model"), adapter)
    assert any("lora_A" in name for name, _ in model.named_parameters())
    from trivium.cli import main as cli
    from trivium.models import lora

    assert cli(["convert", str(adapter.parent), str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    expected = lora.merged_state_dict(model.state_dict(), lora.lora_layers(model))
    assert all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in merged)
    bench = {r["model"]: r for r in read_metrics(run_dir) if r["stage"] == "bench"}
    assert {"base", "sft/step_4", "grpo/step_2"} <= set(bench)  # adapter checkpoints evaluated, merged
    assert all("eval/test/accuracy" in r for r in bench.values())


@pytest.mark.integration
def test_lora_trains_on_two_ddp_ranks(e2e, tmp_path):
    e2e.write(tmp_path)
    result = trivium_run(lora_config(e2e, tmp_path, "lora-ddp", "ddp", 2))
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(tmp_path / "runs" / "e2e" / "lora-ddp")
    assert [r["step"] for r in records if r["stage"] == "grpo" and "train/loss" in r] == [1, 2]


@pytest.mark.integration
@pytest.mark.slow
def test_a_run_resumes_on_another_world_size(e2e, tmp_path):
    """Killed with 2 FSDP2 ranks, continued with 1: the optimizer state is resharded on load."""
    e2e.write(tmp_path)
    path = make_config(e2e, tmp_path, "reshard", "fsdp2", 2, grpo_steps=1)
    assert trivium_run(path, "train:3").returncode == -9  # rank 0 killed in SFT step 3
    resumed = trivium_run(
        path, "", "--set", "stages.0.trainer.world_size=1", "--set", "stages.1.trainer.world_size=1"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "written by trainer.strategy fsdp2 on 2 rank(s); this run trains with fsdp2 on 1" in resumed.stderr
    steps = [
        (r["stage"], r["step"])
        for r in read_metrics(tmp_path / "runs" / "e2e" / "reshard")
        if "train/loss" in r
    ]
    assert steps == [("sft", 1), ("sft", 2), ("sft", 3), ("sft", 4), ("grpo", 1)]

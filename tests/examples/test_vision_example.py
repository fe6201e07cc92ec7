"""examples/vision: the shipped data is what make_data.py writes, and the configs run end to end
(shortened): a tiny Qwen2-VL made in the run folder, SFT on image demonstrations, GRPO on image tasks, each
stored image kept once, checkpoints that load as a whole vision-language model; the FrozenLake agent seen
as pictures (multi-turn SFT demonstrations and GRPO episodes holding a picture per turn)."""

import shutil
from pathlib import Path

import pytest
import yaml

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics
from trivium.tasks.shapes import write_shapes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vision"


def test_the_shipped_data_is_what_make_data_writes(tmp_path):
    paths = write_shapes(tmp_path, seed=0, n_train=2000, n_sft=2000)
    for split, path in paths.items():
        assert path.read_bytes() == (EXAMPLE / "data" / f"{split}.jsonl").read_bytes(), split


def short_example(tmp_path, name="shapes", **top) -> Path:
    """The example's config, shortened (3 SFT steps, 2 GRPO steps of 4 tasks x 4), in a copy of its folder."""
    cfg = yaml.safe_load((EXAMPLE / "shapes.yaml").read_text())
    cfg.update(checkpoint_root=str(tmp_path / "runs"), name=name, monitor={"progress_bar": False}, **top)
    cfg["model"]["tiny"].update(hidden_size=32, num_layers=1, intermediate_size=64)
    cfg["stages"][0]["buffer"].update(total_steps=3, batch_size=8)
    cfg["stages"][1]["buffer"].update(total_steps=2, batch_size=4)
    cfg["stages"][1]["buffer"]["taskset"]["repeat_times"] = 4
    cfg["buffer"]["eval_tasksets"][0]["max_rows"] = 8
    folder = tmp_path / "vision"
    if not folder.exists():
        shutil.copytree(EXAMPLE, folder)
    path = folder / f"test_{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def short_frozenlake(folder: Path, root: Path, name="frozenlake") -> Path:
    """examples/vision/frozenlake.yaml shortened (2 SFT steps of 8 episodes, 2 GRPO steps of 2 tasks x 4
    episodes of at most 3 turns, trajectories recorded every step) over small data written into ``folder``."""
    from trivium.tasks.agent_tasks import write_frozenlake

    cfg = yaml.safe_load((EXAMPLE / "frozenlake.yaml").read_text())
    env_args = cfg["stages"][1]["buffer"]["taskset"]["workflow_args"]["env_args"]  # the pictures it plays on
    write_frozenlake(folder / "data" / "frozenlake", n_train=8, n_test=4, n_sft=16, env_args=env_args)
    cfg.update(checkpoint_root=str(root), name=name)
    cfg["monitor"] = {"progress_bar": False, "trajectories": {"every": 1, "per_step": 4}}
    cfg["model"]["tiny"].update(hidden_size=32, num_layers=1, intermediate_size=64)
    cfg["buffer"]["eval_tasksets"][0].update(max_rows=4)
    cfg["stages"][0]["buffer"].update(total_steps=2, batch_size=8)
    grpo = cfg["stages"][1]["buffer"]
    grpo.update(total_steps=2, batch_size=2)
    grpo["taskset"].update(repeat_times=4)
    for taskset in (grpo["taskset"], cfg["buffer"]["eval_tasksets"][0]):
        taskset["workflow_args"]["max_turns"] = 3
    path = folder / f"test_{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.integration
def test_the_frozenlake_agent_learns_from_pictures_end_to_end_shortened(tmp_path):
    """SFT on the teacher's picture episodes, then GRPO over whole episodes: every experience holds its
    episode's pictures (stored once each), and the recorded samples say where each picture's tokens are."""
    from trivium.models.vision import ImageStore
    from trivium.monitor.trajectories import read_trajectories

    config = short_frozenlake(tmp_path, tmp_path / "runs")
    assert cli(["run", "--config", str(config)]) == 0
    run = tmp_path / "runs" / "vision" / "frozenlake"
    grpo = [r for r in read_metrics(run) if r["stage"] == "grpo"]
    assert grpo[-1]["rollout/count"] == 8 and "eval/test/success" in grpo[-1]
    records = read_trajectories(run)
    assert records and all(len(r["images"]) == len(r["image_spans"]) >= 1 for r in records)
    store = ImageStore(run / "images")
    for r in records:
        tokens = r["prompt_ids"] + r["response_ids"]
        for ref, (start, end) in zip(r["images"], r["image_spans"]):
            assert store.path(ref).is_file() and end - start == 9  # the 3 x 3 cells around: a token a cell
            assert len(set(tokens[start:end])) == 1
        later = [s for s, _ in r["image_spans"][1:]]
        assert all(s >= len(r["prompt_ids"]) for s in later)  # the environment's pictures: in the response
        assert not any(r["mask"][s - len(r["prompt_ids"])] for s in later)


@pytest.mark.integration
def test_the_example_runs_sft_then_grpo_on_images(tmp_path, capsys):
    from trivium.models.loading import load_causal_lm
    from trivium.models.vision import ImageStore, VisionProcessor

    config = short_example(tmp_path)
    assert cli(["run", "--config", str(config)]) == 0
    run = tmp_path / "runs" / "vision" / "shapes"
    records = read_metrics(run)
    grpo = [r for r in records if r["stage"] == "grpo"]
    assert grpo[-1]["rollout/count"] == 16 and "eval/test/accuracy" in grpo[-1]
    assert [r["step"] for r in records if r["stage"] == "sft" and "train/loss" in r] == [1, 2, 3]
    # images stored once each: 24 SFT rows + 8 eval rows (evaluated twice) + 8 tasks of 4 samples
    stored = ImageStore(run / "images").count()
    assert 0 < stored <= 24 + 8 + 8
    model = run / "checkpoints" / "grpo" / "step_2" / "model"
    assert (model / "preprocessor_config.json").is_file()
    assert type(load_causal_lm(model)).__name__ == "Qwen2VLForConditionalGeneration"
    VisionProcessor.from_pretrained(model, ImageStore(tmp_path / "other"))  # the checkpoint is a whole VLM
    # trivium debug: one image task through the workflow, the image's placeholders in the prompt
    capsys.readouterr()
    assert cli(["debug", "-c", str(config), "--stage", "grpo", "--n", "2"]) == 0
    shown = capsys.readouterr().out
    assert "<|vision_start|><|image_pad|>×16<|vision_end|>" in shown and "advantages (grpo" in shown


@pytest.mark.integration
def test_bad_images_in_a_task_set_fail_their_tasks_and_the_run_goes_on(tmp_path):
    """A truncated image, a missing file and a non-image among the GRPO tasks: each fails its task, named in
    failures.jsonl by task and field, and the run completes."""
    import base64
    import json

    config = short_example(tmp_path)
    cfg = yaml.safe_load(config.read_text())
    cfg["stages"][1]["buffer"]["taskset"]["shuffle"] = False
    config.write_text(yaml.safe_dump(cfg))
    rows = [json.loads(line) for line in (config.parent / "data" / "train.jsonl").read_text().splitlines()]
    head, payload = rows[0]["image"].split(",", 1)
    rows[0]["image"] = head + "," + base64.b64encode(base64.b64decode(payload)[:100]).decode()
    rows[1]["image"] = "no/such/board.png"
    rows[2]["image"] = "data:image/png;base64," + base64.b64encode(b"%PDF-1.4").decode()
    (config.parent / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli(["run", "--config", str(config)]) == 0
    run = tmp_path / "runs" / "vision" / "shapes"
    failures = (run / "failures.jsonl").read_text()
    for why in ("damaged or truncated", "cannot read the image file", "not an image"):
        assert why in failures and "field 'image'" in failures
    grpo = [r for r in read_metrics(run) if r["stage"] == "grpo"]
    assert sum(r["rollout/failed_tasks"] for r in grpo) == 3

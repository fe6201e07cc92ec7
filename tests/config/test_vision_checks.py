"""check-config with a vision-language policy: what does not take images yet is refused by field."""

import json

import pytest

from trivium.config import ConfigError
from trivium.validation import validate_raw


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"image": "a.png", "question": "How many?", "answer": "2"}) + "\n"
    )
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"q": "how many red shapes 1 2 3"}) + "\n")
    return tmp_path


def config(architecture="qwen2_vl", **over):
    cfg = {
        "model": {"tiny": {"architecture": architecture, "corpus": ["corpus.jsonl"]}},
        "buffer": {"taskset": {"path": "train.jsonl", "workflow": "visual_qa", "reward_fn": "exact_match"}},
    }
    cfg.update(over)
    return cfg


def paths(raw, base_dir):
    with pytest.raises(ConfigError) as info:
        validate_raw(raw, base_dir)
    return {p.path: p for p in info.value.problems}


def test_a_vision_policy_with_image_tasks_is_valid(data_dir):
    validate_raw(
        config(
            model={"tiny": {"architecture": "qwen2_vl", "corpus": ["corpus.jsonl"]}, "freeze_vision": True}
        ),
        data_dir,
    )


def test_what_does_not_take_images_is_refused_by_field(data_dir):
    found = paths(
        config(
            explorer={"rollout": {"engine_type": "vllm"}},
            trainer={"pack_length": 256},
            algorithm={"algorithm_type": "ppo"},
        ),
        data_dir,
    )
    assert {"explorer.rollout.engine_type", "trainer.pack_length", "algorithm.algorithm_type"} <= set(found)
    assert "transformers" in found["explorer.rollout.engine_type"].fix


def test_image_tasks_and_freeze_vision_need_a_vision_model(data_dir):
    raw = config("qwen2")
    raw["model"]["freeze_vision"] = True
    found = paths(raw, data_dir)
    assert "model.freeze_vision" in found
    assert "qwen2_vl" in found["buffer.taskset.workflow"].fix


def test_the_tiny_vlms_largest_image_comes_from_model_tiny_image_size(data_dir, monkeypatch):
    from trivium.launch.build import ensure_model
    from trivium.models.vision import ImageStore, VisionProcessor

    monkeypatch.chdir(data_dir)
    cfg = validate_raw(
        config(model={"tiny": {"architecture": "qwen2_vl", "corpus": ["corpus.jsonl"], "image_size": 168}}),
        data_dir,
    ).config
    folder = ensure_model(cfg, data_dir / "run")
    processor = json.loads((data_dir / "run" / "base_model" / "preprocessor_config.json").read_text())
    assert processor["size"]["longest_edge"] == 168 * 168  # transformers keeps max_pixels here
    vision = VisionProcessor.from_pretrained(folder, ImageStore(data_dir / "images"))
    from PIL import Image

    (ref,) = vision.put([Image.new("RGB", (336, 336), (255, 0, 0))], "a board")
    assert vision.visual_tokens(vision.pixels(ref)[1]) == 36  # scaled down to 168 x 168: 6 x 6 tokens
    assert "multiple of 28" in str(
        paths(
            config(
                model={"tiny": {"architecture": "qwen2_vl", "corpus": ["corpus.jsonl"], "image_size": 100}}
            ),
            data_dir,
        )
    )

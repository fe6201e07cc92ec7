"""Vision-language policies: images in prompts, one stored copy per image, token-exact log-probs.

A tiny random Qwen2-VL (``make_tiny_vlm``) samples with images through the engine; the trainer's teacher-
forced pass over the same tokens and images gives the same log-probs; the samples of a group share one
stored image; bad images are refused with an error that names where they came from.
"""

from __future__ import annotations

import copy
import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from trivium.config.schema import AlgorithmConfig, TrainerConfig
from trivium.models.chat import render_ids
from trivium.models.handle import ModelHandle
from trivium.models.loading import load_causal_lm
from trivium.models.protocol import SamplingParams
from trivium.models.vision import ImageError, freeze_vision_tower, load_image
from trivium.trainer.logprobs import batched_logprobs, token_logprobs
from trivium.trainer.spec import AlgorithmSpec
from trivium.trainer.trainer import Trainer
from trivium.types import Experience, Task, collate

VLM_CORPUS = ["How many red shapes are there? 3", "Which colour is the square? red blue green 12"] * 20
QUESTION = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red shapes?"}]}
]


@pytest.fixture
def engine(vlm_engine):
    return vlm_engine


def noise(width, height, seed):
    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


def image_prompt(engine, vision, image):
    refs = vision.put([image], "test image")
    return vision.expand(render_ids(engine.tokenizer, QUESTION, True), refs), vision.prompt_images(refs)


def as_experiences(generations, media):
    return [
        Experience(
            tokens=torch.tensor(g.prompt_ids + g.response_ids),
            prompt_length=len(g.prompt_ids),
            action_mask=torch.ones(len(g.response_ids), dtype=torch.bool),
            logprobs=torch.tensor(g.logprobs),
            reward=float(j % 2),
            group_id=i,
            run_index=j,
            images=() if m is None else m.refs,
        )
        for i, (gens, m) in enumerate(zip(generations, media))
        for j, g in enumerate(gens)
    ]


def test_sampled_log_probs_equal_a_teacher_forced_pass_with_the_same_images(engine, vision):
    """Three images of different sizes (4, 12 and 15 visual tokens) and a text-only prompt in one batch."""
    images = [Image.new("RGB", (56, 56), (255, 0, 0)), noise(112, 84, 1), noise(70, 100, 2)]
    prompts, media = map(list, zip(*(image_prompt(engine, vision, im) for im in images)))
    prompts.append(render_ids(engine.tokenizer, [{"role": "user", "content": "How many?"}], True))
    media.append(None)
    assert len({len(p) for p in prompts}) == 4  # the placeholders were widened per image
    gens = engine.generate(prompts, SamplingParams(n=3, max_tokens=12), media=media)
    experiences = as_experiences(gens, media)
    batch = collate(experiences, engine.tokenizer.pad_token_id, images=vision.row_media)
    assert batch.media.row_images.tolist() == [1] * 9 + [0] * 3
    with torch.no_grad():
        whole = token_logprobs(engine.model, batch)
    rows = batched_logprobs(engine.model, batch, micro_batch_size=2)  # rows regrouped: images follow them
    for lp in (whole, rows):
        assert (lp - batch.rollout_logprobs)[batch.loss_mask].abs().max() < 1e-5
    assert int(batch.loss_mask.sum()) >= 30


def test_the_image_decides_the_log_probs(engine, vision):
    """Same tokens, another image of the same size: other log-probs (the image reaches the model)."""
    ids, media = image_prompt(engine, vision, noise(56, 56, 3))
    _, other = image_prompt(engine, vision, noise(56, 56, 4))
    [gens] = engine.generate([ids], SamplingParams(n=2, max_tokens=8), media=[media])
    experiences = as_experiences([gens], [media])
    swapped = [e.replace(images=other.refs) for e in experiences]
    with torch.no_grad():
        a = token_logprobs(engine.model, collate(experiences, 0, images=vision.row_media))
        b = token_logprobs(engine.model, collate(swapped, 0, images=vision.row_media))
    assert (a - b).abs().max() > 1e-3


def test_a_group_shares_one_stored_image_through_every_storage(engine, vision, tmp_path):
    from trivium.buffer.storage import experience_to_record, record_to_experience
    from trivium.workflows.vision import VisualQAWorkflow

    buffer = io.BytesIO()
    noise(90, 60, 5).save(buffer, format="PNG")
    path = tmp_path / "shapes.png"
    path.write_bytes(buffer.getvalue())
    task = Task(
        task_id="t0",
        data={"image": str(path), "question": "How many red shapes?", "answer": "3"},
        workflow="visual_qa",
        reward_fn="math_verify",
        repeat_times=4,
    )
    handle = ModelHandle(engine, SamplingParams(n=4, max_tokens=6))
    experiences = VisualQAWorkflow().run(task, handle)
    assert len(experiences) == 4 and len({e.images for e in experiences}) == 1
    assert vision.store.count() == 1
    [ref] = experiences[0].images
    assert vision.store.path(ref).stat().st_size < 30_000  # a reference travels, not pixels
    back = record_to_experience(experience_to_record(experiences[0]))
    assert back.images == (ref,)
    assert torch.equal(back.tokens, experiences[0].tokens)


def test_a_trainer_step_on_image_experiences_trains_the_vision_tower_unless_frozen(vlm_dir, engine, vision):
    images = [noise(56, 56, 6), noise(84, 56, 7)]
    prompts, media = map(list, zip(*(image_prompt(engine, vision, im) for im in images)))
    experiences = as_experiences(
        engine.generate(prompts, SamplingParams(n=4, max_tokens=8), media=media), media
    )
    for freeze in (False, True):
        policy = load_causal_lm(vlm_dir)
        if freeze:
            assert freeze_vision_tower(policy) > 0
        before = copy.deepcopy(policy.state_dict())
        spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="grpo"))
        trainer = Trainer(
            policy,
            TrainerConfig(lr=1e-3, micro_batch_size=3),
            spec,
            pad_token_id=engine.tokenizer.pad_token_id,
            total_steps=2,
            max_response_length=8,
            vision=vision,
        )
        metrics = trainer.train_step(experiences)
        assert np.isfinite(metrics["train/loss"])
        changed = {k for k, v in policy.state_dict().items() if not torch.equal(v, before[k])}
        vision_changed = {k for k in changed if ".visual." in f".{k}"}
        assert any("language_model" in k or "lm_head" in k or "embed" in k for k in changed)
        assert bool(vision_changed) is not freeze, sorted(vision_changed)[:3]


def test_experiences_with_images_need_a_vision_model_and_unpacked_rows(engine, vision):
    ids, media = image_prompt(engine, vision, noise(56, 56, 8))
    experiences = as_experiences(
        engine.generate([ids], SamplingParams(n=2, max_tokens=4), media=[media]), [media]
    )
    with pytest.raises(ValueError, match="carries images, and this trainer's model takes none"):
        collate(experiences, 0)
    with pytest.raises(ValueError, match=r"trainer\.pack_length"):
        collate(experiences, 0, pack_length=64, images=vision.row_media)


def test_selecting_rows_keeps_each_rows_own_images(vision):
    refs = [vision.put([noise(28 * (k + 2), 56, k)], "t") for k in range(3)]
    rows = [refs[0], (), refs[2] + refs[1], refs[1]]
    media = vision.row_media(rows)
    for pick in ([3, 0], [2], [1, 2, 0]):
        direct = vision.row_media([rows[r] for r in pick])
        got = media.rows(pick)
        assert torch.equal(got.pixel_values, direct.pixel_values)
        assert torch.equal(got.image_grid_thw, direct.image_grid_thw)
        assert got.row_images.tolist() == direct.row_images.tolist()


def test_placeholders_must_match_the_images(engine, vision):
    ids, media = image_prompt(engine, vision, noise(56, 56, 9))
    first = ids.index(vision.image_token_id)
    with pytest.raises(ValueError, match="holds 3 image placeholder tokens and its images give 4"):
        engine.generate([ids[:first] + ids[first + 1 :]], SamplingParams(max_tokens=2), media=[media])
    with pytest.raises(ImageError, match="1 image placeholder"):
        vision.expand(render_ids(engine.tokenizer, QUESTION, True), media.refs * 2)


def _png(width, height):
    out = io.BytesIO()
    noise(width, height, 0).save(out, format="PNG")
    return out.getvalue()


def _with_header_size(png: bytes, width: int, height: int) -> bytes:
    """The PNG with its IHDR claiming ``width`` x ``height`` (CRC fixed), pixel data unchanged."""
    ihdr = png[12:16] + struct.pack(">II", width, height) + png[24:29]
    return png[:8] + png[8:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (_png(64, 64)[:6000], "damaged or truncated"),
        (_with_header_size(_png(64, 64), 8_000, 6_000), "8000x6000 pixels, over"),
        (_with_header_size(_png(64, 64), 40_000, 30_000), "too large"),
        (b"%PDF-1.4 not an image at all", "not an image"),
        (np.zeros((4, 4, 5), dtype=np.uint8), r"shape \(4, 4, 5\)"),
        (np.full((4, 4, 3), 300.0), "uint8 values"),
        ("data:text/plain;base64,aGVsbG8=", "data:image/png;base64"),
        ("data:image/png;base64,%%%", "not valid base64"),
        ("https://example.com/cat.png", "remote URL"),
        ("no/such/image.png", "cannot read the image file"),
        (b"", "not an image"),
    ],
)
def test_bad_images_are_refused_with_where_they_came_from(value, message):
    with pytest.raises(ImageError, match=message) as error:
        load_image(value, "train.jsonl row 17, field 'image'")
    assert "train.jsonl row 17" in str(error.value)


def test_image_modes_are_converted_to_rgb():
    for mode in ("L", "CMYK", "I;16", "P", "RGBA", "1"):
        assert load_image(Image.new(mode, (8, 6)), "x").mode == "RGB"
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent: white, as viewers show it
    assert load_image(rgba, "x").getpixel((0, 0)) == (255, 255, 255)
    assert load_image(np.zeros((5, 7), dtype=np.uint8), "x").size == (7, 5)


def test_the_image_placeholder_is_never_sampled_and_log_probs_stay_unfiltered():
    from trivium.models.sampling import sample_next

    logits = torch.zeros(64, 10)
    logits[:, 7] = 8.0  # the placeholder is by far the likeliest token
    never = torch.tensor([7])
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.0), SamplingParams(top_k=2)):
        tokens, logprobs = sample_next(logits, params, torch.Generator().manual_seed(0), never)
        assert not (tokens == 7).any()
        expected = torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1)
        assert torch.allclose(logprobs, expected)

"""The endpoint with a vision-language model: image_url parts (data URLs) through a real HTTP server, recorded
sessions that continue image conversations token for token, and bad images refused naming their part."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from trivium.models.batching import BatchingRolloutModel
from trivium.models.loading import load_causal_lm, load_tokenizer
from trivium.models.transformers_engine import TransformersEngine
from trivium.models.vision import ImageStore, VisionProcessor
from trivium.serve.openai_server import OpenAIServer
from trivium.serve.recorder import Recorder
from trivium.trainer.logprobs import token_logprobs
from trivium.types import collate

CORPUS = ["Which colour has the most shapes? red green blue", "What is in the picture? A red square."] * 20


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from trivium.models.tiny_vlm import make_tiny_vlm

    root = tmp_path_factory.mktemp("vlm")
    path = make_tiny_vlm(root / "model", CORPUS, hidden_size=64, num_layers=2)
    engine = TransformersEngine(
        load_causal_lm(path), load_tokenizer(path), device="cpu", dtype="float32", seed=0
    )
    engine.vision = VisionProcessor.from_pretrained(path, ImageStore(root / "images"))
    return engine


@pytest.fixture(scope="module")
def recorder():
    return Recorder(default_session=None)


@pytest.fixture(scope="module")
def server(vlm, recorder):
    with OpenAIServer(BatchingRolloutModel(vlm), model_name="tiny-vlm", recorder=recorder) as srv:
        yield srv


def data_url(seed: int, size=(56, 56), fmt="PNG") -> str:
    pixels = (np.random.RandomState(seed).rand(size[1], size[0], 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(out.getvalue()).decode()


def truncated(url: str) -> str:
    """The data URL of the first half of its image's bytes."""
    head, payload = url.split(",", 1)
    data = base64.b64decode(payload)
    return f"{head}," + base64.b64encode(data[: len(data) // 2]).decode()


def image_message(url: str, text: str) -> dict:
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
    }


def test_an_image_question_is_answered_with_its_visual_tokens_in_the_prompt(server, vlm):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    out = client.chat.completions.create(
        model="tiny-vlm", messages=[image_message(data_url(1), "What is in the picture?")], max_tokens=5
    )
    prompt = out.model_extra["prompt_token_ids"]
    assert prompt.count(vlm.image_token_id) == 4  # a 56 x 56 image: 4 visual tokens
    assert len(out.choices[0].model_extra["token_ids"]) >= 1
    assert vlm.image_token_id not in out.choices[0].model_extra["token_ids"]


def test_a_recorded_image_conversation_continues_token_for_token_and_trains_exactly(server, vlm, recorder):
    """Two calls, an image in each: the second continues the first's transcript; the concat experience
    carries both images, and the trainer's pass over it gives the engine's log-probs."""
    session = recorder.session("pictures")
    client = session.client()
    messages = [image_message(data_url(2), "What is in the picture?")]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=1.0)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        image_message(data_url(3, (84, 56)), "And in this one?"),
    ]
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=1.0)
    assert second.model_extra["prefix_reused"] is True
    calls = session.calls
    assert (
        len(calls[0].images) == 1 and calls[1].images[0] == calls[0].images[0] and len(calls[1].images) == 2
    )
    assert all(len(ref) == 64 for m in calls[1].messages for ref in _refs(m))  # no data URL is kept
    [experience] = session.experiences(1.0, mode="concat")
    assert experience.images == calls[1].images
    batch = collate([experience], vlm.tokenizer.pad_token_id, images=vlm.vision.row_media)
    with torch.no_grad():
        lp = token_logprobs(vlm.model, batch)
    assert (lp - batch.rollout_logprobs)[batch.loss_mask].abs().max() < 1e-5


def _refs(message):
    content = message.get("content")
    return [p["image"] for p in content if p.get("type") == "image"] if isinstance(content, list) else []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://example.com/cat.png", "data URLs are not fetched"),
        (truncated(data_url(4)), "damaged or truncated"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not an image"),
    ],
)
def test_bad_images_are_refused_naming_their_part(server, url, message):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}, image_message(url, "?")], max_tokens=2
        )
    assert message in str(error.value) and "messages[1].content[0]" in str(error.value)
    health = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert health.choices  # the server goes on


def test_a_text_model_refuses_images(serve_model_dir):
    engine = TransformersEngine(
        load_causal_lm(serve_model_dir),
        load_tokenizer(serve_model_dir),
        device="cpu",
        dtype="float32",
        seed=0,
    )
    with OpenAIServer(engine, model_name="tiny") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="takes no images"):
            client.chat.completions.create(
                model="m", messages=[image_message(data_url(5), "?")], max_tokens=2
            )

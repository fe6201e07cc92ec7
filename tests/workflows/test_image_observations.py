"""Environments that answer with pictures: multi-turn episodes of a tiny vision-language model.

FrozenLake drawn as an image every turn (``observation: image``), played by a random tiny Qwen2-VL through
the multi-turn workflows: the experiences hold every picture of their episode (one stored copy each), the
engine's log-probs equal the trainer's teacher-forced pass with the same pictures, and a bad picture or a
text-only model fails the episode with an error that says where.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from trivium.envs.base import Environment, StepResult, image_part
from trivium.envs.frozenlake import COLOURS, IMAGE_INSTRUCTION, FrozenLakeEnv, render_image
from trivium.models.handle import ModelHandle
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.trainer.logprobs import batched_logprobs, token_logprobs
from trivium.types import Task, collate
from trivium.workflows.multi_turn import ConcatenatedMultiTurnWorkflow, StepWiseWorkflow

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]
VLM_CORPUS = [IMAGE_INSTRUCTION, "left right up down Invalid action. Use left, down, right or up."] * 20


@pytest.fixture
def engine(vlm_engine):
    return vlm_engine


def lake_task():
    return Task(task_id="lake", data={"map": MAP}, workflow="multi_turn", reward_fn="", repeat_times=2)


def play(workflow_class, engine, turns=3, **env_args):
    workflow = workflow_class(
        env="frozenlake", env_args={"observation": "image", **env_args}, max_turns=turns, env_timeout_s=0
    )
    model = ModelHandle(engine, SamplingParams(n=2, temperature=1.0, max_tokens=6))
    return workflow, workflow.run(lake_task(), model)


def test_the_picture_shows_the_map_and_the_player():
    image = np.asarray(render_image(MAP, 2, 1, cell_px=28))
    assert image.shape == (4 * 28, 4 * 28, 3)
    centre = {(r, c): tuple(image[r * 28 + 14, c * 28 + 14]) for r in range(4) for c in range(4)}
    assert centre[(2, 1)] == COLOURS["P"]
    assert (
        centre[(1, 1)] == COLOURS["H"] and centre[(3, 3)] == COLOURS["G"] and centre[(0, 0)] == COLOURS["S"]
    )
    assert tuple(image[2 * 28 + 2, 1 * 28 + 2]) == COLOURS["F"]  # the player is drawn inside its cell
    local = np.asarray(render_image(MAP, 0, 0, cell_px=28, view=3))  # the 3 x 3 cells around the player
    assert local.shape == (84, 84, 3)
    seen = {(i, j): tuple(local[i * 28 + 14, j * 28 + 14]) for i in range(3) for j in range(3)}
    assert seen[(1, 1)] == COLOURS["P"] and seen[(2, 2)] == COLOURS["H"] and seen[(1, 2)] == COLOURS["F"]
    assert all(seen[cell] == COLOURS["W"] for cell in [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0)])  # the edge
    with pytest.raises(ValueError, match="view must be an odd integer"):
        FrozenLakeEnv(observation="image", view=2)
    with pytest.raises(ValueError, match="set observation: image too"):
        FrozenLakeEnv(view=3)
    with pytest.raises(ValueError, match="observation must be 'text' or 'image'"):
        FrozenLakeEnv(observation="pixels")
    with pytest.raises(ValueError, match="cell_px"):
        FrozenLakeEnv(observation="image", cell_px=4)


def test_every_turn_is_a_picture_and_the_first_has_the_colour_rules():
    env = FrozenLakeEnv(observation="image")
    [opening] = env.reset(lake_task())
    assert opening["role"] == "user" and opening["content"][0]["text"].startswith(IMAGE_INSTRUCTION)
    assert opening["content"][1]["type"] == "image" and opening["content"][1]["image"].size == (112, 112)
    result = env.step("down")
    [message] = result.observation
    assert [p["type"] for p in message["content"]] == ["image"]
    moved = np.asarray(message["content"][0]["image"])
    assert tuple(moved[28 + 14, 14]) == COLOURS["P"]  # one row down
    result = env.step("no idea")
    assert result.observation[0]["content"][0]["text"].startswith("Invalid action. Use left")
    assert env.step("right").info["steps"] == 3.0


@pytest.mark.parametrize("workflow_class", [ConcatenatedMultiTurnWorkflow, StepWiseWorkflow])
def test_log_probs_equal_a_teacher_forced_pass_with_the_episodes_pictures(engine, vision, workflow_class):
    """Pictures inside the response (environment turns) as well as in the prompt; fp32, whole batch and
    micro-batches of 2 rows."""
    _, experiences = play(workflow_class, engine, turns=3, max_steps=3)
    for e in experiences:
        placeholders = int((e.tokens == vision.image_token_id).sum())
        assert placeholders == 16 * len(e.images)  # a 4x4 map at 28 px a cell: 16 visual tokens
    concat = workflow_class is ConcatenatedMultiTurnWorkflow
    if concat:  # the opening picture and one per step but the last (the episode ended there)
        assert all(len(e.images) == e.metrics["turns"] for e in experiences)
        assert any(len(e.images) == 3 for e in experiences)
    else:  # a turn's prompt holds the pictures seen before it
        assert sorted({len(e.images) for e in experiences}) == [1, 2, 3]
        assert all(len(e.images) == e.turn + 1 for e in experiences)
    batch = collate(experiences, engine.tokenizer.pad_token_id, images=vision.row_media)
    with torch.no_grad():
        whole = token_logprobs(engine.model, batch)
    rows = batched_logprobs(engine.model, batch, micro_batch_size=2)
    for lp in (whole, rows):
        assert (lp - batch.rollout_logprobs)[batch.loss_mask].abs().max() < 1e-5
    assert int(batch.loss_mask.sum()) >= 12


def test_a_group_stores_each_picture_once(engine, vision):
    _, experiences = play(ConcatenatedMultiTurnWorkflow, engine, turns=3, max_steps=3)
    refs = {r for e in experiences for r in e.images}
    assert experiences[0].images[0] == experiences[1].images[0]  # both episodes start on the same map
    assert vision.store.count() == len(refs) and len(refs) <= 5  # start + at most 2 other states each


class BadPictureEnv(Environment):
    """Answers the second episode's first move with a truncated PNG (the first episode's with a good one)."""

    made = 0

    def __init__(self):
        self.index = BadPictureEnv.made
        BadPictureEnv.made += 1

    def reset(self, task):
        return [
            {
                "role": "user",
                "content": [image_part(np.zeros((56, 56, 3), np.uint8)), {"type": "text", "text": "Go."}],
            }
        ]

    def step(self, action):
        png = render_image(MAP, 0, 0)
        buffer = io.BytesIO()
        png.save(buffer, format="PNG")
        data = buffer.getvalue()
        image = data[: len(data) // 2] if self.index == 1 else data
        return StepResult(observation=[{"role": "user", "content": [image_part(image)]}])


def test_a_bad_picture_fails_its_episode_only_and_says_where(engine):
    BadPictureEnv.made = 0
    workflow = ConcatenatedMultiTurnWorkflow(env=f"{__name__}:BadPictureEnv", max_turns=2, env_timeout_s=0)
    model = ModelHandle(engine, SamplingParams(n=2, temperature=1.0, max_tokens=4))
    [experience] = workflow.run(lake_task(), model)
    assert experience.run_index == 0 and len(experience.images) == 2
    [(run, reason)] = workflow.failed_runs
    assert run == 1
    assert "task lake run 1, " in reason and ".step 0, message 0 part 0" in reason and "truncated" in reason


def test_a_text_model_refuses_picture_observations_with_the_fix(tiny_model_dir):
    engine = TransformersEngine.from_pretrained(tiny_model_dir, seed=0)
    workflow = ConcatenatedMultiTurnWorkflow(env="frozenlake", env_args={"observation": "image"})
    model = ModelHandle(engine, SamplingParams(n=2, max_tokens=4))
    with pytest.raises(RuntimeError, match="every episode of task lake failed") as caught:
        workflow.run(lake_task(), model)
    assert "message 0 holds an image and the rollout model takes none" in str(caught.value)
    assert "make-tiny --vlm" in str(caught.value)


def test_picture_demonstrations_train_on_the_moves_only(engine, vision, tmp_path):
    """SFT ``messages`` rows holding pictures (the teacher's FrozenLake episodes as data URLs): each
    picture stored once and widened to its visual tokens, the loss on the assistant's moves only; a model
    without images refuses the row naming it; sizing counts each picture as ``image_tokens``."""
    from trivium.buffer.offline import SftReader
    from trivium.config.schema import SftDatasetConfig
    from trivium.tasks.agent_tasks import write_frozenlake

    paths = write_frozenlake(tmp_path, n_train=1, n_test=1, n_sft=6, env_args={"observation": "image"})
    cfg = SftDatasetConfig(path=str(paths["sft"]), format="messages", shuffle=False)
    reader = SftReader(cfg, engine.tokenizer, vision=vision)
    experiences = reader.next_batch(6)
    rows = [json.loads(line) for line in paths["sft"].read_text().splitlines()]
    for row, e in zip(rows, experiences):
        pictures = [p for m in row["messages"] if isinstance(m["content"], list) for p in m["content"]]
        pictures = [p for p in pictures if p["type"] == "image"]
        moves = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert len(e.images) == len(pictures) == len(moves)
        assert vision.store.path(e.images[0]).exists()
        assert int((e.tokens == vision.image_token_id).sum()) == 16 * len(pictures)
        trained = engine.tokenizer.decode(
            e.tokens[e.prompt_length :][e.action_mask].tolist(), skip_special_tokens=True
        )
        assert trained.split() == moves  # each move and its end-of-turn token (skipped by decode)
        assert not (e.tokens[e.prompt_length :][e.action_mask] == vision.image_token_id).any()
    batch = collate(experiences, engine.tokenizer.pad_token_id, images=vision.row_media)
    with torch.no_grad():
        assert torch.isfinite(token_logprobs(engine.model, batch)[batch.loss_mask]).all()

    with pytest.raises(ValueError, match=r"row 0: message 0 holds an image and the model takes none"):
        SftReader(cfg, engine.tokenizer).next_batch(1)
    sized = SftReader(cfg, engine.tokenizer, image_tokens=16).next_batch(6)
    assert [len(s.tokens) for s in sized] == [len(e.tokens) for e in experiences]

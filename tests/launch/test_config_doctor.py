"""`trivium doctor`: the derived quantities of each stage, worked out here from the config by hand, and the
memory estimate against the measured peak of real runs (quickstart and the 25M engine-benchmark model)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.launch.peak_rss import measure

from trivium.launch.config_doctor import explain
from trivium.validation import load_config

REPO = Path(__file__).resolve().parents[2]


def small_config(tmp_path, model_dir, data_dir, **trainer):
    cfg = {
        "project": "doc",
        "name": "small",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(model_dir)},
        "explorer": {"rollout": {"max_tokens": 10}},
        "buffer": {
            "batch_size": 4,
            "total_epochs": 2,
            "taskset": {"path": str(data_dir / "train.jsonl"), "repeat_times": 4},
        },
        "trainer": {"mini_batch_size": 8, "ppo_epochs": 2, "micro_batch_size": 3, **trainer},
        "synchronizer": {"sync_interval": 2, "sync_offset": 1},
        "stages": [
            {"name": "rl"},
            {
                "name": "sft",
                "mode": "train",
                "algorithm": {"algorithm_type": "sft"},
                "buffer": {
                    "batch_size": 16,
                    "total_steps": 5,
                    "sft_dataset": {
                        "path": str(data_dir / "sft.jsonl"),
                        "fields": {"prompt": "question", "response": "answer"},
                    },
                },
            },
        ],
    }
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(path)


def test_doctor_derives_each_quantity_of_each_stage(tmp_path, tiny_model_dir, word_problem_dir):
    from transformers import AutoModelForCausalLM

    from trivium.launch import build
    from trivium.models.chat import render_ids
    from trivium.models.loading import load_tokenizer

    run_cfg = small_config(tmp_path, tiny_model_dir, word_problem_dir, share_prompts=False)
    text, (rl, sft) = explain(run_cfg)
    rows = len(build.task_reader(run_cfg.stages[0].config.buffer.taskset, 0, is_eval=False))
    steps = 2 * math.ceil(rows / 4)  # total_epochs x ceil(rows / batch_size)
    assert rl.total_steps == steps and f"{steps} steps (2 epoch(s) x ceil({rows} tasks / 4)" in text
    assert (
        "4 tasks per step (buffer.batch_size) x 4 samples each (taskset.repeat_times) = 16 experiences"
        in text
    )
    # 16 experiences / mini-batches of 8 = 2, x 2 ppo_epochs = 4 optimizer steps; 8 rows / micro 3 = 3 passes
    assert "= 2 mini-batch(es) x 2 ppo_epochs = 4 optimizer step(s) per step" in text
    assert (
        "8 rows per mini-batch on each of 1 rank(s), at most 3 rows (trainer.micro_batch_size) and 4096 "
        "tokens (trainer.max_tokens_per_micro_batch) per pass = 3 forward/backward" in text
    )
    assert "at most 2 - 1 + 1 = 2 version(s) old" in text  # sync_interval - 1 + sync_offset
    tokenizer = load_tokenizer(tiny_model_dir)
    prompt = max(
        len(render_ids(tokenizer, [{"role": "user", "content": t.data["question"]}], True))
        for t in build.task_reader(run_cfg.stages[0].config.buffer.taskset, 0, is_eval=False).all_tasks()
    )
    assert rl.shapes.seq_len == prompt + 10 and f"at most {16 * (prompt + 10):,} tokens per step" in text
    assert sft.total_steps == 5 and sft.shapes.experiences == 16 and sft.shapes.in_flight == 0
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    params = sum(p.numel() for p in model.parameters())
    assert f"{params:,} parameters" in text
    w = rl.estimate.parts["trainer"]
    assert w["weights"] == params * 4 and w["optimizer state"] == 2 * params * 4  # fp32 AdamW: two moments
    kv = rl.estimate.parts["rollout"]["KV cache"]
    c = model.config
    assert (
        kv
        == 16
        * c.num_hidden_layers
        * 2
        * c.num_key_value_heads
        * (c.hidden_size // c.num_attention_heads)
        * (prompt + 10)
        * 4
    )


def test_the_doctor_sizes_shared_prompt_rows_where_the_trainer_takes_them(
    tmp_path, tiny_model_dir, word_problem_dir
):
    separate = explain(small_config(tmp_path, tiny_model_dir, word_problem_dir, share_prompts=False))[1][0]
    prompt = separate.shapes.seq_len - 10
    text, (rl, _) = explain(small_config(tmp_path, tiny_model_dir, word_problem_dir))  # auto
    row = prompt - 1 + 4 * (1 + 10)  # the prompt once, then each of 4 samples: its copy of the last token
    share = row / (4 * (prompt + 10))
    assert share <= 0.6  # what auto takes (trainer/layout.py SHARE_AT)
    assert (
        f"a task's samples share a row (trainer.share_prompts: auto): the prompt once + 4 x (1 + 10) = {row} "
        f"tokens, {share:.0%} of one row a sample" in text
    )
    # a mini-batch of 8 sequences is 2 rows; the sampler's sequences are what they were
    assert rl.shapes.seq_len == row and rl.shapes.rows_per_micro == 2 and rl.shapes.loss_tokens == 40
    assert rl.shapes.rollout_seq == separate.shapes.rollout_seq == prompt + 10
    assert "2 rows per mini-batch on each of 1 rank(s)" in text
    # the masks: one additive float32 [L, L] a row (fp32 here), which the 2 layers share
    import dataclasses

    from trivium.launch.config_doctor import model_and_tokenizer
    from trivium.launch.memory_estimate import estimate

    shape = model_and_tokenizer(small_config(tmp_path, tiny_model_dir, word_problem_dir).stages[0].config)[0]
    args = (shape, dataclasses.replace(rl.shapes, shared_rows=False), "float32", "float32")
    unmasked = estimate(*args).parts["trainer"]["activations"]
    assert rl.estimate.parts["trainer"]["activations"] - unmasked == 2 * row**2 * 4
    # a budget of 3 samples a row: rows of 3 and 1 (the doctor sizes the fuller); off: one row a sample
    three = row - 11
    tight = explain(
        small_config(tmp_path, tiny_model_dir, word_problem_dir, max_tokens_per_micro_batch=three)
    )
    assert tight[1][0].shapes.seq_len == three
    assert (
        explain(small_config(tmp_path, tiny_model_dir, word_problem_dir, pack_length=128))[1][
            0
        ].shapes.seq_len
        == 128
    )


def test_bf16_optimizer_moments_halve_the_estimated_optimizer_state(
    tmp_path, tiny_model_dir, word_problem_dir
):
    fp32 = explain(small_config(tmp_path, tiny_model_dir, word_problem_dir))[1][0].estimate
    bf16 = explain(
        small_config(tmp_path, tiny_model_dir, word_problem_dir, optimizer_state_dtype="bfloat16")
    )[1][0].estimate
    state = fp32.parts["trainer"]["optimizer state"]
    assert bf16.parts["trainer"]["optimizer state"] == state / 2
    assert bf16.parts["trainer"]["weights"] == fp32.parts["trainer"]["weights"]  # weights stay float32
    assert bf16.steady == fp32.steady - state / 2


def test_gradients_and_activations_are_counted_together_only_where_they_meet(
    tmp_path, tiny_model_dir, word_problem_dir
):
    """A rank's share of a mini-batch in one pass (8 rows, micro 8): the gradients (None after each update)
    grow as backward frees the activations, so training counts the larger of the gradients and the
    activations with the head's gradient (backward's first); in 3 passes (micro 3) they accumulate beside
    the next pass's activations, and DDP's buckets keep them: both counted."""
    from trivium.launch.config_doctor import model_and_tokenizer

    facts = {}
    for label, trainer in {
        "one pass": {"micro_batch_size": 8},
        "passes": {"micro_batch_size": 3},
        "ddp": {"micro_batch_size": 8, "strategy": "ddp", "world_size": 1},
    }.items():
        trainer["share_prompts"] = False  # a row a sequence
        text, (rl, _) = explain(small_config(tmp_path, tiny_model_dir, word_problem_dir, **trainer))
        facts[label] = (text, rl.shapes, rl.estimate)
    text, shapes, est = facts["one pass"]
    t = est.parts["trainer"]
    assert shapes.rows_per_update == shapes.rows_per_micro == 8 and not shapes.grads_meet_activations
    shape = model_and_tokenizer(small_config(tmp_path, tiny_model_dir, word_problem_dir).stages[0].config)[0]
    head_grad = shape.vocab * shape.hidden * 4
    assert est.train_transient == max(t["gradients"], t["activations"] + head_grad)
    assert "the larger of gradients and activations with the head's gradient, one pass an update" in text
    for label in ("passes", "ddp"):
        text, shapes, est = facts[label]
        t = est.parts["trainer"]
        assert shapes.grads_meet_activations, label
        assert est.train_transient == t["gradients"] + t["activations"], label
        assert "one pass an update" not in text, label


@pytest.mark.slow
def test_doctor_cli_explains_or_names_the_bad_field(tmp_path, tiny_model_dir, word_problem_dir):
    small_config(tmp_path, tiny_model_dir, word_problem_dir)
    run = [sys.executable, "-m", "trivium.cli", "doctor", str(tmp_path / "small.yaml")]
    ok = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "stage 1/2 rl" in ok.stdout and "stage 2/2 sft" in ok.stdout and "peak" in ok.stdout
    bad = subprocess.run(
        [*run, "--set", "trainer.micro_batch_size=0"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "trainer.micro_batch_size" in bad.stderr


def _quickstart_grpo(tmp_path) -> Path:
    """The quickstart's GRPO stage alone, 2 steps, no eval, from its tiny model (made first, outside the
    measured process), on one thread."""
    q = yaml.safe_load((REPO / "examples/quickstart/grpo_word_problems.yaml").read_text())
    data = REPO / "examples/quickstart/data"
    q["model"]["tiny"]["corpus"] = [str(data / "train.jsonl"), str(data / "sft.jsonl")]
    q["model"]["path"] = str(tmp_path / "model")
    q["checkpoint_root"] = str(tmp_path / "runs")
    grpo = q.pop("stages")[1]
    grpo["buffer"]["taskset"]["path"] = str(data / "train.jsonl")
    grpo["buffer"]["total_steps"] = 2
    for key, value in grpo.items():  # the stage's sections over the top level's, one level deep
        if key not in ("name", "buffer"):
            q[key] = {**q.get(key, {}), **value} if isinstance(value, dict) else value
    q["buffer"] = grpo["buffer"]  # without the top level's eval task sets: two steps, no evaluation
    q.update(monitor={"progress_bar": False}, runtime={"num_threads": 1})
    path = tmp_path / "quickstart_grpo.yaml"
    path.write_text(yaml.safe_dump(q))
    return path


def _w25m(tmp_path) -> Path:
    """The 25M model of benchmarks/engines.py (hidden 512, 8 layers, 8 heads / 4 kv, MLP 1536) in two GRPO
    steps on its explained word problems: 8 tasks x 2 samples, <= 128 new tokens, one pass of 16 rows an
    update (the second step's peak holds the optimizer state the first step made)."""
    from trivium.tasks.word_problems import write_word_problems

    data = tmp_path / "w25m-data"
    write_word_problems(data, seed=0, n_train=64, n_test=8, n_sft=256, style="explained")
    w = {
        "project": "mem",
        "name": "w25m",
        "checkpoint_root": str(tmp_path / "runs"),
        "monitor": {"progress_bar": False},
        "runtime": {"num_threads": 1},
        "model": {
            "path": str(tmp_path / "w25m"),
            "tiny": {
                "corpus": [str(data / "train.jsonl"), str(data / "sft.jsonl")],
                "hidden_size": 512,
                "num_layers": 8,
                "num_heads": 8,
                "num_kv_heads": 4,
                "intermediate_size": 1536,
                "vocab_size": 512,
            },
        },
        "explorer": {"rollout": {"max_tokens": 128}, "eval_at_start": False},
        "buffer": {
            "batch_size": 8,
            "total_steps": 2,
            "taskset": {"path": str(data / "train.jsonl"), "repeat_times": 2},
        },
        "trainer": {"micro_batch_size": 16},
    }
    path = tmp_path / "w25m.yaml"
    path.write_text(yaml.safe_dump(w))
    return path


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("make", [_quickstart_grpo, _w25m], ids=["quickstart", "w25m"])
def test_memory_estimate_within_20_percent_of_measured_peak(tmp_path, make):
    from trivium.launch import build

    path = make(tmp_path)
    run_cfg = load_config(path)
    build.ensure_model(run_cfg.stages[0].config, tmp_path)  # the model exists before the measured run
    text, (facts,) = explain(load_config(path))
    measured = measure(path)
    estimated = facts.estimate.peak / 2**20
    ratio = estimated / measured["peak_mb"]
    print(f"{path.stem}: estimated {estimated:.0f} MiB, measured {measured}, ratio {ratio:.2f}")
    assert 0.8 <= ratio <= 1.2, (text, measured)


def test_the_explore_process_of_a_decoupled_run_holds_no_trainer(tmp_path, tiny_model_dir, word_problem_dir):
    cfg = {
        "mode": "explore",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(tiny_model_dir)},
        "buffer": {
            "batch_size": 2,
            "total_steps": 3,
            "storage": {},
            "taskset": {"path": str(word_problem_dir / "train.jsonl"), "repeat_times": 2},
        },
    }
    (tmp_path / "explore.yaml").write_text(yaml.safe_dump(cfg))
    text, (facts,) = explain(load_config(tmp_path / "explore.yaml"))
    assert "none in this process" in text and "micro " not in text
    assert list(facts.estimate.parts) == ["rollout"]
    rollout = facts.estimate.parts["rollout"]
    assert facts.estimate.peak == rollout["weights"] + rollout["KV cache"] + rollout["activations"]


HEAD_WORKER = Path(__file__).with_name("head_memory_worker.py")


@pytest.mark.parametrize(
    ("vocab", "precision", "head"),
    [
        (32_768, "fp32", "fp32"),
        (151_936, "fp32", "fp32"),
        (151_936, "bf16", "fp32"),
        (151_936, "bf16", "autocast"),
    ],
)
def test_the_trainer_estimate_holds_at_real_vocabularies_and_prompt_lengths(vocab, precision, head):
    """The vocabulary head dominates a small model's step at 32k-152k vocabularies. The trainer projects
    the loss tokens only (64 of a row's 320), so the estimate counts those: within 25% of what a GRPO step
    after the first holds beside the weights (AdamW's moments and the pass), where logits for every
    position would overstate it 3.5-4x. In bf16 with ``trainer.head_grad_precision: autocast`` the head's
    backward adds its bf16 operands (measured 339 against 278 MiB in fp32 on 2026-12-07), which the estimate
    counts then."""
    from trivium.launch.memory_estimate import ModelShape, Shapes, estimate
    from trivium.trainer.logprobs import HEAD_CHUNK_VALUES

    prompt, response, rows = 256, 64, 4
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    args = [
        sys.executable,
        str(HEAD_WORKER),
        str(vocab),
        str(prompt),
        str(response),
        str(rows),
        precision,
        head,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    shape = ModelShape(measured["params"], 2, 64, 4, 2, 16, 128, vocab)  # head_memory_worker.SHAPE

    def step_growth(loss_tokens: int, head_chunk: int) -> float:
        s = Shapes(
            rows,
            rows,
            prompt + response,
            loss_tokens,
            0,
            0,
            measured["params"],
            0,
            rollout_engine=False,
            head_chunk=head_chunk,
            head_low_products=head == "autocast",
            rows_per_update=rows,
        )
        found = estimate(shape, s, "float32", "float32", autocast=precision == "bf16")  # AdamW's moments
        # (made at the first step) and the pass
        return (found.parts["trainer"]["optimizer state"] + found.train_transient) / 2**20

    ratio = step_growth(response, HEAD_CHUNK_VALUES // vocab) / measured["grown_mb"]
    assert 0.8 <= ratio <= 1.25, (ratio, measured)
    assert step_growth(prompt + response, 0) / measured["grown_mb"] > 3  # what counting every position said


@pytest.mark.parametrize("pictures", [False, True])
def test_a_multi_turn_stage_is_sized_by_its_episodes(tmp_path, pictures):
    """FrozenLake through `multi_turn`: the doctor resets the environment and steps it once per probed task,
    and counts an episode as the opening + max_turns x (max_tokens + 1) + (max_turns - 1) x the reply; with
    pictures each image counts as the tiny VLM's largest image (16 tokens at 112 x 112)."""
    from trivium.envs.base import as_messages, make_env
    from trivium.launch.build import corpus_lines, ensure_model
    from trivium.models.chat import render_ids
    from trivium.models.loading import load_tokenizer
    from trivium.models.tiny import build_tokenizer
    from trivium.tasks.agent_tasks import write_frozenlake
    from trivium.types import Task

    env_args = {"observation": "image"} if pictures else {}
    paths = write_frozenlake(tmp_path / "data", n_train=8, n_test=2, n_sft=4, env_args=env_args)
    tiny = {"corpus": [str(paths["corpus"])], "hidden_size": 32, "num_layers": 1, "vocab_size": 320}
    if pictures:
        tiny["architecture"] = "qwen2_vl"
    cfg = {
        "project": "doc",
        "name": "lake",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"tiny": tiny},
        "explorer": {"rollout": {"max_tokens": 6}},
        "buffer": {
            "batch_size": 2,
            "total_steps": 1,
            "taskset": {
                "path": str(paths["train"]),
                "workflow": "multi_turn",
                "workflow_args": {"env": "frozenlake", "env_args": env_args, "max_turns": 5},
                "repeat_times": 4,
            },
        },
    }
    path = tmp_path / "lake.yaml"
    path.write_text(yaml.safe_dump(cfg))
    text, _ = explain(load_config(path))
    line = next(x for x in text.splitlines() if x.strip().startswith("tokens"))
    # the same count by hand, for the first task (every generated 4x4 map's opening has one length), with
    # the tokenizer the run's model gets
    run_cfg = load_config(path)
    if pictures:
        tokenizer = load_tokenizer(ensure_model(run_cfg.config, tmp_path / "runs" / "doc" / "lake"))
    else:
        tokenizer = build_tokenizer(list(corpus_lines(run_cfg.config.model.tiny)), 320, 4096)
    row = json.loads(paths["train"].read_text().splitlines()[0])
    env = make_env("frozenlake", **env_args)
    opening = as_messages(env.reset(Task("t", row, "multi_turn", "")))
    image = [{"type": "image"}]
    if pictures:
        opening = [{"role": "user", "content": [opening[0]["content"][0], *image]}]
    first = len(render_ids(tokenizer, opening, True)) + (15 if pictures else 0)
    assert f"an episode: opening {first} tokens + 5 turns" in line
    reply = int(line.split(" sampled + ")[1].split(" ")[0])
    assert f"= {first + 5 * 7 + 4 * reply} per sequence" in line
    assert reply > (16 if pictures else 31)  # an invalid turn's reply: help text and the observation


def test_an_image_task_sets_prompt_counts_each_images_visual_tokens(tmp_path):
    """visual_qa over shape boards: the doctor's longest prompt equals the prompt the engine gets (the
    template's placeholder widened to the image's 16 visual tokens), before the tiny VLM exists."""
    from trivium.launch.build import ensure_model
    from trivium.models.chat import render_ids
    from trivium.models.loading import load_tokenizer
    from trivium.models.vision import ImageStore, VisionProcessor
    from trivium.tasks.shapes import write_shapes
    from trivium.types import Task
    from trivium.workflows.vision import VisualQAWorkflow

    paths = write_shapes(tmp_path / "data", n_train=8, n_sft=8, n_test=2)
    cfg = {
        "project": "doc",
        "name": "boards",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"tiny": {"architecture": "qwen2_vl", "corpus": [str(paths["train"])], "vocab_size": 300}},
        "buffer": {
            "batch_size": 2,
            "total_steps": 1,
            "taskset": {"path": str(paths["train"]), "workflow": "visual_qa", "reward_fn": "exact_match"},
        },
    }
    path = tmp_path / "boards.yaml"
    path.write_text(yaml.safe_dump(cfg))
    text, _ = explain(load_config(path))
    said = int(text.split("longest prompt ")[1].split(" ")[0])
    folder = ensure_model(load_config(path).config, tmp_path / "runs" / "doc" / "boards")
    tokenizer, vision = (
        load_tokenizer(folder),
        VisionProcessor.from_pretrained(folder, ImageStore(tmp_path / "img")),
    )
    row = json.loads(paths["train"].read_text().splitlines()[0])
    refs = vision.put([row["image"]], "row 0")
    messages = VisualQAWorkflow().messages(Task("t", row, "visual_qa", "exact_match"))
    assert said == len(vision.expand(render_ids(tokenizer, messages, True), refs))

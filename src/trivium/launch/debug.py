"""``trivium debug``: one task through the configured workflow, environment and reward, and what the
trainer would see of it, without a trainer or a buffer.

    trivium debug -c cfg.yaml                      # row 0 of the stage's task set, its repeat_times samples
    trivium debug -c cfg.yaml --task 17 --n 2      # row 17, two samples
    trivium debug -c cfg.yaml --prompt "3 plus 4?" # your own question (workflows with a question field)
    trivium debug -c cfg.yaml --pdb                # stop in the workflow when it raises
    trivium debug -c cfg.yaml --out debug.jsonl    # records the Studio trajectory viewer opens

It loads the stage's rollout model (``model.path``, or the run's tiny model) and runs the task the way a
training step does (``Explorer.run_tasks``: the same workflow, reward guard, retries and time limits), then
prints each experience: its tokens with the action mask shown (the tokens trained on, the environment's
tokens that are not, the prompt), reward and its parts, log-probs; what the stage's experience operators
would keep, change or drop; the advantages the stage's algorithm would give the group (without a KL
penalty or a critic, which need the trainer's forward passes: said when they apply); and where the time
went (inside the model engine, and outside it: environment, reward, workflow code). ``--pdb`` runs the
workflow on this thread instead, so that an exception stops in the debugger where it was raised.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import TextIO

import torch

from trivium.launch import build

__all__ = ["debug_stage", "mask_runs", "render_tokens"]

_COLORS = {"prompt": "\033[2m", "action": "\033[32m", "env": "\033[33m"}
_MARKS = {"prompt": ("", ""), "action": ("[[", "]]"), "env": ("{{", "}}")}
_RESET = "\033[0m"


def mask_runs(e) -> list[tuple[str, int]]:
    """The experience's tokens as runs of one kind: ``prompt``, ``action`` (trained on: the action mask)
    or ``env`` (response tokens off the mask: an environment's or a tool's)."""
    kinds = ["prompt"] * e.prompt_length + ["action" if m else "env" for m in e.action_mask.bool().tolist()]
    runs: list[tuple[str, int]] = []
    for kind in kinds:
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + 1)
        else:
            runs.append((kind, 1))
    return runs


def render_tokens(e, tokenizer, color: bool, image_token: int | None = None) -> str:
    """The experience's text, each run of one kind coloured (a terminal) or marked: ``[[trained]]``,
    ``{{environment}}``, the prompt plain; an image's visual tokens (``image_token``) shown once with their
    count, e.g. ``<|image_pad|>×16``."""
    ids, out, at = e.tokens.tolist(), [], 0
    placeholder = tokenizer.convert_ids_to_tokens(image_token) if image_token is not None else None
    for kind, n in mask_runs(e):
        text = tokenizer.decode(ids[at : at + n])
        if placeholder:
            run = re.compile(f"(?:{re.escape(placeholder)})+")
            text = run.sub(lambda m: f"{placeholder}×{len(m.group()) // len(placeholder)}", text)
        at += n
        if color:
            out.append(f"{_COLORS[kind]}{text}{_RESET}")
        else:
            left, right = _MARKS[kind]
            out.append(f"{left}{text}{right}")
    return "".join(out)


def debug_stage(
    run_cfg,
    *,
    stage: str | None = None,
    task: int = 0,
    prompt: str | None = None,
    n: int | None = None,
    use_pdb: bool = False,
    out: Path | None = None,
    stream: TextIO | None = None,
    color: bool | None = None,
) -> int:
    """Run one task of ``stage`` (the first stage with a task set when None) and print what came of it;
    returns the process's exit code (1 when the task failed)."""
    from trivium.launch.run import run_dir_of

    chosen = _stage(run_cfg, stage)
    cfg = chosen.config
    stream = sys.stdout if stream is None else stream
    color = stream.isatty() if color is None else color
    say = lambda *parts: print(*parts, file=stream)  # noqa: E731
    the_task = _task(cfg, task, prompt, n)
    path = build.ensure_model(cfg, run_dir_of(run_cfg))
    t0 = time.perf_counter()
    policy, tokenizer = build.load_policy(path, cfg)
    model = build.build_rollout_model(policy, tokenizer, cfg, version=0, weights="take")
    say(f"stage {chosen.name}: model {path} (loaded in {time.perf_counter() - t0:.1f} s)")
    say(f"task {the_task.task_id} (workflow {the_task.workflow}, reward {the_task.reward_fn}, "
        f"{the_task.repeat_times} sample(s)): {json.dumps(dict(the_task.data), default=str)[:300]}")  # fmt: skip
    rollout_params, _ = build.sampling_params(cfg)
    engine_s0, t0 = model.engine_seconds, time.perf_counter()
    if use_pdb:
        experiences = _run_here(the_task, model, rollout_params)
        failures: list[dict] = []
    else:
        experiences, failures = _run_like_a_step(cfg, model, the_task, rollout_params)
    seconds, engine_s = time.perf_counter() - t0, model.engine_seconds - engine_s0
    for f in failures:
        say(f"FAILED ({f['when']}, run {f['run_index']}, attempt {f['attempt']}): {f['reason']}")
    experiences = [e.replace(group_id=0) for e in experiences]
    vision = getattr(model, "vision", None)
    image_token = vision.image_token_id if vision is not None else None
    for i, e in enumerate(experiences):
        _show(say, i, e, tokenizer, color, image_token)
    advantages = None
    if experiences:
        _show_operators(say, cfg, experiences)
        advantages = _show_advantages(say, cfg, experiences, tokenizer)
    say(f"\ntime: {seconds:.2f} s for the task, {engine_s:.2f} s in the model engine, "
        f"{max(0.0, seconds - engine_s):.2f} s outside it (environment, reward, workflow code)")  # fmt: skip
    if out is not None:
        _write_records(out, chosen.name, experiences, tokenizer, advantages, image_token)
        say(f"wrote {len(experiences)} record(s) to {out} (trivium studio's trajectory viewer opens it as a "
            "run folder's trajectories.jsonl)")  # fmt: skip
    return 0 if experiences else 1


def _stage(run_cfg, name: str | None):
    stages = run_cfg.stages
    if name is not None:
        for s in stages:
            if s.name == name:
                return s
        raise ValueError(f"--stage {name!r}: the config's stages are {[s.name for s in stages]}")
    for s in stages:
        if s.config.buffer.taskset is not None or s.config.buffer.tasksets:
            return s
    raise ValueError(
        f"no stage of this config explores a task set (stages {[s.name for s in stages]}): trivium debug runs "
        "a task through a workflow; give a config with buffer.taskset"
    )


def _task(cfg, index: int, prompt: str | None, n: int | None):
    b = cfg.buffer
    ts = b.tasksets[0] if b.tasksets else b.taskset
    tasks = build.task_reader(ts, cfg.seed, is_eval=False).all_tasks()
    if not tasks:
        raise ValueError(f"the task set {ts.path} has no task to debug")
    if not 0 <= index < len(tasks):
        raise ValueError(f"--task {index}: the task set {ts.path} has tasks 0..{len(tasks) - 1}")
    task = tasks[index]
    if prompt is not None:
        if "question" not in task.data:
            raise ValueError(
                f"--prompt: workflow {task.workflow!r} reads no 'question' field (it reads "
                f"{sorted(task.data)}); pick a row of the task set with --task N"
            )
        task = dataclasses.replace(
            task, data={**task.data, "question": prompt}, task_id=f"{task.task_id}:prompt"
        )
    if n is not None:
        task = dataclasses.replace(task, repeat_times=n)
    return task


def _run_like_a_step(cfg, model, task, params) -> tuple[list, list[dict]]:
    """The task through ``Explorer.run_tasks``, as in a training step; its failures recorded, not raised."""
    explorer = build.make_explorer(cfg, None, model=model)
    failures: list[dict] = []
    explorer.failure_sink = failures.append
    explorer._phase = "debug"
    try:
        (result,) = explorer.run_tasks([task], params, use_repeat_times=True)
    except RuntimeError as exc:  # every task failed: this one
        if not failures:
            raise
        failures.append({"when": "debug", "run_index": None, "attempt": "-", "reason": repr(exc.__cause__)})
        return [], failures
    return result.experiences, failures


def _run_here(task, model, params) -> list:
    """The workflow on this thread; an exception stops in the debugger (``--pdb``)."""
    import pdb

    from trivium.models.handle import ModelHandle
    from trivium.workflows.registry import get_workflow

    handle = ModelHandle(
        model, dataclasses.replace(params, n=task.repeat_times), None, None, task.on_long_row
    )
    try:
        workflow = get_workflow(task.workflow)(**dict(task.workflow_args))
        return workflow.run(task, handle)
    except Exception:
        pdb.post_mortem(sys.exc_info()[2])
        return []


def _show(say, i: int, e, tokenizer, color: bool, image_token: int | None) -> None:
    parts = {k: round(v, 4) for k, v in e.metrics.items() if isinstance(v, (int, float))}
    lp = e.logprobs[e.action_mask.bool()].float()
    say(f"\n--- experience {i} (run {e.run_index}, turn {e.turn}): reward {e.reward:.4f}  {parts}")
    runs = " · ".join(f"{kind} {count}" for kind, count in mask_runs(e))
    say(f"tokens: {runs}")
    if lp.numel():
        say(f"log-probs of the {lp.numel()} trained token(s): mean {float(lp.mean()):.3f}, "
            f"min {float(lp.min()):.3f}")  # fmt: skip
    say(render_tokens(e, tokenizer, color, image_token))


def _show_operators(say, cfg, experiences: list) -> None:
    pipeline = build.experience_ops(cfg)
    if pipeline is None:
        say("\nexperience operators: none (buffer.experience_ops is empty): the group is trained as it is")
        return
    kept, metrics = pipeline([list(experiences)])
    after = kept[0] if kept else []
    verdict = "kept" if kept else "DROPPED"
    changed = sum(a.reward != b.reward for a, b in zip(experiences, after, strict=False))
    say(f"\nexperience operators {pipeline.names()}: the group is {verdict}"
        + (f", {changed} reward(s) changed: {[round(e.reward, 4) for e in after]}" if kept else "")
        + f"  {({k: round(v, 4) for k, v in metrics.items()})}")  # fmt: skip


def _show_advantages(say, cfg, experiences: list, tokenizer) -> list[list[float]] | None:
    """Print the group's advantages; returns each experience's per response token (None: not computed)."""
    from trivium.algorithm import AdvantageInputs
    from trivium.algorithm.registry import ADVANTAGE_FNS
    from trivium.algorithm.rewards_shaping import outcome_token_rewards
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.types import collate

    spec = AlgorithmSpec.from_config(cfg.algorithm)
    if spec.advantage_fn is None:
        say(f"\nadvantages: algorithm {spec.name} uses none (an offline loss)")
        return None
    missing = sorted(spec.advantage_requires - {"token_rewards"})
    if missing:
        say(f"\nadvantages: {spec.advantage_fn} reads {missing}, which the trainer's forward passes give: "
            "not shown here")  # fmt: skip
        return None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    batch = collate([e.replace(images=()) for e in experiences], pad)  # no forward pass: images not needed
    inputs = AdvantageInputs.from_batch(batch)
    inputs = dataclasses.replace(
        inputs, token_rewards=outcome_token_rewards(batch.rewards, batch.loss_mask, batch.seq_index)
    )
    advantages, _ = ADVANTAGE_FNS.get(spec.advantage_fn)(inputs, **spec.advantage_args)
    per_seq = [_first_on_mask(advantages, batch, i) for i in range(len(experiences))]
    note = []
    if cfg.algorithm.kl_penalty.coef > 0:
        note.append("without the KL penalty (it needs the reference's log-probs)")
    if len(experiences) < 2:
        note.append("a group of one has no baseline: ask for --n 2 or more")
    elif len({e.reward for e in experiences}) == 1:
        note.append("every reward is equal: this group teaches the policy nothing")
    say(f"\nadvantages ({spec.advantage_fn} {spec.advantage_args or ''}) of the group, first trained token of "
        f"each: {[round(a, 4) for a in per_seq]}" + (f" ({'; '.join(note)})" if note else ""))  # fmt: skip
    return [_response_values(advantages, batch, i, e) for i, e in enumerate(experiences)]


def _response_values(values: torch.Tensor, batch, i: int, e) -> list[float]:
    """Sequence ``i``'s values on its response tokens (0 off the action mask), as the trajectory records."""
    row, cols = (batch.seq_index == i).nonzero(as_tuple=True)
    resp = cols[e.prompt_length :]
    v = values[row[0], resp].float()
    return [round(x, 5) for x in torch.where(e.action_mask.bool(), v, torch.zeros_like(v)).tolist()]


def _first_on_mask(advantages: torch.Tensor, batch, i: int) -> float:
    on = (batch.seq_index == i) & batch.loss_mask
    return float(advantages[on][0]) if on.any() else 0.0


def _write_records(out: Path, stage: str, experiences: list, tokenizer, advantages, image_token=None) -> None:
    from trivium.monitor.trajectories import token_record

    lines = [{"stage": stage, "step": 0, "global_step": 0, **token_record(e, tokenizer, image_token),
              "messages": e.info.get("messages"), "response": e.info.get("response")}
             for e in experiences]  # fmt: skip
    for line, adv in zip(lines, advantages or [], strict=False):
        line["advantage"] = adv
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")

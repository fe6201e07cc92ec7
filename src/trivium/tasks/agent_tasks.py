"""Synthetic agent tasks with "confused teachers", for tiny multi-turn RL runs on a CPU.

Two tasks, each written as train/test task sets and SFT demonstrations (chat ``messages`` with the tools the
agent sees), by running the real environments (``trivium.envs``) with a scripted teacher, so that the
demonstrations hold exactly the observations the agent will get:

- ``calculator``: "What is 47 * 16?" — the agent calls the calculator tool (``<tool_call>`` JSON), reads
  the result and answers ``#### 752``. A tiny model cannot multiply in its head, so answering without the
  tool is almost always wrong. The teacher skips the tool and guesses with a fixed probability *per
  operation* (``SKIP_TOOL``): after SFT the agent uses the tool for ``+`` and guesses for ``*``, a gap the
  answer reward closes.
- ``frozenlake``: gymnasium's FrozenLake on random 4x4 maps (seeded), one move per turn. The teacher walks
  a shortest path but, where the best move is ``right``, says ``down`` with probability ``CONFUSION``; the
  SFT agent then prefers ``down`` there, which ends in holes or walls. Reaching the goal is rewarded.
  ``env_args={"observation": "image"}``: the same game seen as pictures (for a vision-language model); the
  demonstrations hold every picture as a PNG data URL.

Every random stream is derived from ``(seed, label)``; the same arguments give byte-identical files; test
splits exclude every train/SFT question (calculator) or map seed (frozenlake).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from trivium.envs.base import Environment, as_messages, make_env
from trivium.models.vision import data_url
from trivium.types import Task

__all__ = ["CONFUSION", "SKIP_TOOL", "write_calculator", "write_frozenlake"]

SKIP_TOOL = {"+": 0.15, "-": 0.5, "*": 0.8}  # chance that the calculator teacher guesses instead
# The tiny agent learns the tool's call format from the demonstrations: no system prompt, no schema in the
# prompt. A long prompt in front of the question kept a 1M model from learning to copy numbers (measured:
# with the schema, 800 SFT steps left every digit copy wrong on held-out questions).
CALCULATOR_ENV_ARGS = {"system_prompt": "", "show_tools": False}
CONFUSION = 0.6  # chance that the FrozenLake teacher says "down" where "right" is best
_OPS = ("+", "-", "*")
_QUESTION = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.")


def _rng(seed: int, label: str) -> random.Random:
    return random.Random(f"{seed}/{label}")


# ------------------------------------------------------------------------------------------ calculator
def calculator_rows(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict[str, Any]]:
    """``n`` rows ``{"question", "answer", "op"}`` with distinct questions not in ``exclude``."""
    rng, rows, seen = _rng(seed, "calculator"), [], set(exclude)
    while len(rows) < n:
        op = rng.choice(_OPS)
        if op == "*":
            a, b = rng.randint(12, 99), rng.randint(3, 19)
        else:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if op == "-" and b > a:
                a, b = b, a
        question = rng.choice(_QUESTION).format(a=a, op=op, b=b)
        if question in seen:
            continue
        seen.add(question)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"question": question, "answer": str(value), "op": op, "expression": f"{a} {op} {b}"})
    return rows


def _wrong_guess(value: int, rng: random.Random) -> int:
    digits = list(str(value))
    k = rng.randrange(len(digits))
    choices = [d for d in "0123456789" if d != digits[k] and not (k == 0 and d == "0" and len(digits) > 1)]
    digits[k] = rng.choice(choices)
    return int("".join(digits))


def calculator_demo(row: dict[str, Any], rng: random.Random, env_args: dict | None = None) -> dict[str, Any]:
    """The teacher's episode for ``row`` as ``{"messages", "tools"}`` (run through the real environment)."""
    from trivium.tools import format_tool_call

    env = make_env("calculator", **(CALCULATOR_ENV_ARGS if env_args is None else env_args))
    task = Task("demo", row, "react", "math_verify")
    if rng.random() < SKIP_TOOL[row["op"]]:
        turns = [f"#### {_wrong_guess(int(row['answer']), rng)}"]
    else:
        turns = [format_tool_call("calculator", {"expression": row["expression"]}), None]
    return {**_run_teacher(env, task, turns), "op": row["op"]}


def write_calculator(out_dir: str | Path, *, seed: int = 0, n_train=2000, n_test=200, n_sft=12000) -> dict:
    """``train``/``test`` task sets (``question``, ``answer``), ``sft`` demonstrations and a tokenizer
    ``corpus``, as JSONL files in ``out_dir``; returns their paths."""
    train = calculator_rows(n_train, seed * 3 + 0)
    sft_rows = calculator_rows(n_sft, seed * 3 + 1)
    test = calculator_rows(n_test, seed * 3 + 2, exclude={r["question"] for r in train + sft_rows})
    rng = _rng(seed, "calculator-teacher")
    sft = [calculator_demo(r, rng) for r in sft_rows]
    return _write(out_dir, train=train, test=test, sft=sft, corpus=_corpus(sft))


# ------------------------------------------------------------------------------------------ frozenlake
_MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def _teacher_move(desc: list[str], cell: tuple[int, int], rng: random.Random) -> str:
    from trivium.envs.frozenlake import shortest_path

    here = [
        "".join("S" if (r, c) == cell else ("F" if ch == "S" else ch) for c, ch in enumerate(line))
        for r, line in enumerate(desc)
    ]
    best = (shortest_path(here) or ["right"])[0]
    return "down" if best == "right" and rng.random() < CONFUSION else best


def frozenlake_demo(
    row: dict[str, Any], rng: random.Random, max_turns: int, env_args: dict | None = None
) -> dict[str, Any]:
    from trivium.envs.frozenlake import map_from_row

    desc = map_from_row(row)
    env = make_env("frozenlake", **(env_args or {}))
    task = Task("demo", row, "multi_turn", "exact_match")
    cell = (0, 0)
    moves = []
    for _ in range(max_turns):
        move = _teacher_move(desc, cell, rng)
        moves.append(move)
        dr, dc = _MOVES[move]
        cell = (min(max(cell[0] + dr, 0), len(desc) - 1), min(max(cell[1] + dc, 0), len(desc[0]) - 1))
        if desc[cell[0]][cell[1]] in "HG":
            break
    return _run_teacher(env, task, moves)


def write_frozenlake(
    out_dir: str | Path,
    *,
    seed: int = 0,
    size: int = 4,
    n_train=2000,
    n_test=200,
    n_sft=8000,
    max_turns=8,
    env_args: dict | None = None,
) -> dict:
    """Task sets of ``{"size", "seed"}`` maps (test seeds disjoint from train/SFT), teacher demonstrations
    of at most ``max_turns`` moves (the environment made with ``env_args``, e.g. ``{"observation": "image"}``
    for pictures), and a tokenizer corpus, as JSONL files in ``out_dir``."""
    seeds = list(range(seed * 1_000_000, seed * 1_000_000 + n_train + n_sft + n_test))
    _rng(seed, "frozenlake-seeds").shuffle(seeds)
    row = lambda s: {"size": size, "seed": s}  # noqa: E731
    train = [row(s) for s in seeds[:n_train]]
    sft_rows = [row(s) for s in seeds[n_train : n_train + n_sft]]
    test = [row(s) for s in seeds[n_train + n_sft :]]
    rng = _rng(seed, "frozenlake-teacher")
    sft = [frozenlake_demo(r, rng, max_turns, env_args) for r in sft_rows]
    return _write(out_dir, train=train, test=test, sft=sft, corpus=_corpus(sft))


# ----------------------------------------------------------------------------------------------- shared
def _run_teacher(env: Environment, task: Task, turns: list[str | None]) -> dict[str, Any]:
    """Play ``turns`` in ``env``; ``None`` answers with the last tool result (``#### <result>``)."""
    messages = as_messages(env.reset(task))
    tools = env.tool_schemas()
    reward = 0.0
    try:
        for turn in turns:
            text = f"#### {messages[-1]['content']}" if turn is None else turn
            messages.append({"role": "assistant", "content": text})
            result = env.step(text)
            reward += result.reward
            if result.done:
                break
            messages += as_messages(result.observation)
    finally:
        env.close()
    if messages[-1]["role"] != "assistant":  # the teacher ran out of turns mid-episode
        messages.pop()
    out: dict[str, Any] = {"messages": [_json_message(m) for m in messages], "reward": reward}
    if tools:
        out["tools"] = tools
    return out


def _json_message(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as a JSON row holds it: pictures (image parts) as PNG data URLs."""
    content = message["content"]
    if not isinstance(content, list):
        return message
    parts = [
        {"type": "image", "image": data_url(p["image"])} if p.get("type") == "image" else p for p in content
    ]
    return {**message, "content": parts}


def _texts(content: str | list) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content if p.get("type") == "text"]


def _corpus(demos: list[dict[str, Any]]) -> list[dict[str, str]]:
    texts = {t for d in demos for m in d["messages"] for t in _texts(m["content"])}
    texts |= {json.dumps(t["function"]) for d in demos[:1] for t in d.get("tools", [])}
    return [{"text": t} for t in sorted(texts)]


def _write(out_dir: str | Path, **splits: list[dict[str, Any]]) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in splits.items():
        paths[name] = out / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return paths

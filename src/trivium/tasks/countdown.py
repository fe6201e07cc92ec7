"""Countdown tasks: reach a target from given numbers with + - * /, each number used at most once.

A row is ``{"numbers": [3, 5, 7], "target": 56, "question": "Make 56 from 3 5 7.", "answer": ...}``;
``answer`` is a worked solution, one equation per line, then the expression after ``####``:

    3+5=8
    8*7=56
    #### (3+5)*7

Every task is solvable by construction: the target *is* the value of a drawn expression (the numbers are
combined left to right in a drawn order, each intermediate value a positive integer: a subtraction never
goes to 0 or below, a division is exact), so ``answer`` is a solution. ``solve`` finds one by search,
independently, for tests. The ``countdown`` reward (``rewards/countdown.py``) accepts any expression that
reaches the target, not only this one.

The "confused teacher" (``noisy=True``, the SFT demonstrations of ``examples/countdown``): for each step
it writes a wrong operation with a fixed probability per *right* operation (``CONFUSION``), and works the
wrong one out correctly, so its solution misses the target. A model trained on it reaches some targets
and misses others, while still sampling the right operation sometimes: a gap that the exact reward can
close, as in the quickstart (``tasks/word_problems.py``).

Design decisions:
- Every random stream comes from ``(seed, label)``, so splits never share one, and the noisy rows of a
  seed are the gold rows' tasks (the teacher draws from its own stream).
- ``shuffle=False`` shows the numbers in the order the solution uses them (an easier task for tiny models:
  only the operations are to be found); ``shuffle=True`` shows them sorted (the usual countdown).
- The test split excludes every question of the train and SFT splits.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Collection, Sequence
from fractions import Fraction
from pathlib import Path

__all__ = ["CONFUSION", "countdown_prompt", "generate_rows", "render", "solve", "write_countdown"]

CONFUSION = {"+": 0.15, "-": 0.35, "*": 0.6, "/": 0.6}  # P(teacher writes another op | the right op)
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def countdown_prompt(numbers: Sequence[int], target: int) -> str:
    """The question: ``Make 56 from 3 5 7.`` (the ``countdown`` workflow's default prompt too)."""
    return f"Make {target} from {' '.join(str(n) for n in numbers)}."


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b != 0 else None


def render(numbers: Sequence[int], ops: Sequence[str]) -> str:
    """The expression of ``numbers`` combined left to right by ``ops``, with the parentheses it needs."""
    text, last = str(numbers[0]), None
    for op, n in zip(ops, numbers[1:]):
        if last is not None and _PRECEDENCE[last] < _PRECEDENCE[op]:
            text = f"({text})"
        text, last = f"{text}{op}{n}", op
    return text


def _worked(numbers: Sequence[int], ops: Sequence[str]) -> tuple[list[str], Fraction]:
    value, lines = Fraction(numbers[0]), []
    for op, n in zip(ops, numbers[1:]):
        new = _apply(value, op, Fraction(n))
        if new is None:  # only a confused teacher divides by zero: written as such, the value stays
            lines.append(f"{_fmt(value)}{op}{n}=undefined")
            continue
        lines.append(f"{_fmt(value)}{op}{n}={_fmt(new)}")
        value = new
    return lines, value


def _fmt(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _draw(rng: random.Random, k: int, max_number: int, ops: str, max_target: int):
    """``k`` numbers and ops whose left-to-right value is a positive integer <= max_target at every step."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(k)]
        chosen, value = [], Fraction(numbers[0])
        for n in numbers[1:]:
            results = {op: _apply(value, op, Fraction(n)) for op in ops}
            valid = [
                op
                for op, v in results.items()
                if v is not None and v.denominator == 1 and 0 < v <= max_target
            ]
            if not valid:
                break
            chosen.append(rng.choice(valid))
            value = results[chosen[-1]]
        else:
            return numbers, chosen, int(value)


def _teacher(ops: Sequence[str], allowed: str, rng: random.Random) -> list[str]:
    out = []
    for op in ops:
        if rng.random() < CONFUSION[op]:
            op = rng.choice([o for o in allowed if o != op])
        out.append(op)
    return out


def generate_rows(
    n: int,
    *,
    seed: int,
    n_numbers: int = 3,
    max_number: int = 9,
    ops: str = "+-*",
    max_target: int = 100,
    shuffle: bool = False,
    noisy: bool = False,
    exclude: Collection[str] = (),
) -> list[dict]:
    """``n`` rows (module docstring); every target is reached by the row's own (gold) solution."""
    if n < 0 or n_numbers < 2 or max_number < 1 or not ops or set(ops) - set(_PRECEDENCE):
        raise ValueError(
            f"generate_rows(n={n}, n_numbers={n_numbers}, max_number={max_number}, ops={ops!r}): need n >= 0, "
            "n_numbers >= 2, max_number >= 1 and ops from '+-*/'"
        )
    task_rng, teacher_rng = random.Random(f"{seed}/tasks"), random.Random(f"{seed}/teacher")
    rows: list[dict] = []
    budget = 100 * n + 100
    while len(rows) < n:
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"generate_rows: {n - len(rows)} more rows were all in exclude; ask for fewer")
        used, chosen, target = _draw(task_rng, n_numbers, max_number, ops, max_target)
        shown = sorted(used) if shuffle else list(used)
        question = countdown_prompt(shown, target)
        if question in exclude:
            continue
        written = _teacher(chosen, ops, teacher_rng) if noisy else chosen
        lines, _ = _worked(used, written)
        answer = "\n".join([*lines, f"#### {render(used, written)}"])
        rows.append({"numbers": shown, "target": target, "question": question, "answer": answer})
    return rows


def solve(numbers: Sequence[int], target: int) -> str | None:
    """An expression reaching ``target`` with each number at most once (any order, any tree), or None.

    Exhaustive over combining two values of the pool at a time (exact fractions): for tests, small inputs."""
    pool = [(Fraction(x), str(x)) for x in numbers]

    def search(items):
        for value, text in items:
            if value == target:
                return text
        for (i, (a, ta)), (j, (b, tb)) in itertools.permutations(enumerate(items), 2):
            rest = [it for k, it in enumerate(items) if k not in (i, j)]
            for op in "+-*/":
                v = _apply(a, op, b)
                if v is not None and (found := search([*rest, (v, f"({ta}{op}{tb})")])):
                    return found
        return None

    return search(pool)


def write_countdown(
    out_dir: str | Path, *, seed: int = 0, n_train: int = 4000, n_test: int = 256, n_sft: int = 4000, **kw
) -> dict[str, Path]:
    """``train.jsonl`` (gold), ``sft.jsonl`` (confused teacher) and ``test.jsonl`` (gold, disjoint);
    ``kw`` goes to ``generate_rows``. Same arguments give byte-identical files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    split_seed = {s: random.Random(f"{seed}/{s}").getrandbits(63) for s in ("train", "sft", "test")}
    train = generate_rows(n_train, seed=split_seed["train"], **kw)
    sft = generate_rows(n_sft, seed=split_seed["sft"], noisy=True, **kw)
    seen = {r["question"] for r in train} | {r["question"] for r in sft}
    test = generate_rows(n_test, seed=split_seed["test"], exclude=seen, **kw)
    paths = {}
    for split, rows in (("train", train), ("test", test), ("sft", sft)):
        paths[split] = out / f"{split}.jsonl"
        with paths[split].open("w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return paths

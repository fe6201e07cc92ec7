"""Synthetic GSM8K-style word problems with a "confused teacher", for tiny end-to-end RL runs on a CPU.

A problem is one or two "has / gains / loses" steps: ``Zoe has 13 coins. Zoe sells 4 coins. How many coins
does Zoe have now?``, solved as ``13-4=9`` then ``#### 9``. The teacher that writes the SFT demonstrations
writes the wrong operation with a fixed probability *per verb* (``Verb.confusion``), and slips by one on
the final number 5% of the time. After SFT the policy is right for the verbs the teacher rarely confuses
and wrong for the others, while still sampling the right operation sometimes: a gap the exact-match reward
can close, by construction.

Design decisions:
- Every random stream is derived from ``(seed, label)``, so splits never share a stream, and the gold and
  the noisy rows of one seed are the same problems (the teacher draws from its own stream). Comparing
  ``generate_rows(n, seed=s)`` with ``generate_rows(n, seed=s, noisy=True)`` row by row shows every slip.
- Operands are drawn so that every intermediate value is >= 0 whichever operations are applied, so a
  confused teacher never writes a negative count either; a slip on a final 0 goes up, never down.
- The test split excludes every question of the train and SFT splits (exact text), so test accuracy
  is never inflated by memorised rows.

Two styles. ``short`` (the quickstart): one or two steps, equation lines only, ~20-token answers.
``explained`` (the 25M engine benchmark's workload, after bench/engines' W2): three to five steps (or
``steps``) from a start of 20-40, every step narrated, ~100-token answers:

    Ava starts with 25 pens.
    Ava wins 1 more pens, so add: 25+1=26.
    ...
    So Ava has 24 pens now.
    #### 24

Left out: multiplication/division and multi-entity problems; the point is a learnable gap, not coverage.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["ITEMS", "NAMES", "VERBS", "Verb", "corpus", "generate_rows", "write_word_problems"]

Op = Literal["+", "-"]


@dataclass(frozen=True)
class Verb:
    phrase: str  # formatted with n (the operand) and item, e.g. "sells {n} {item}"
    op: Op  # the true operation
    confusion: float  # probability that the noisy teacher writes the other operation


NAMES = ("Tom", "Ann", "Sam", "Mia", "Ben", "Lily", "Max", "Zoe", "Leo", "Ava", "Noah", "Emma")
ITEMS = ("apples", "pens", "books", "coins", "cards", "eggs", "cookies", "stamps", "marbles", "shells")
VERBS = (
    Verb("buys {n} more {item}", "+", 0.05),
    Verb("finds {n} more {item}", "+", 0.75),
    Verb("gets {n} more {item}", "+", 0.70),
    Verb("wins {n} more {item}", "+", 0.60),
    Verb("receives {n} more {item}", "+", 0.20),
    Verb("loses {n} {item}", "-", 0.05),
    Verb("sells {n} {item}", "-", 0.75),
    Verb("gives away {n} {item}", "-", 0.70),
    Verb("drops {n} {item}", "-", 0.60),
    Verb("uses {n} {item}", "-", 0.20),
)
SLIP_PROB = 0.05  # noisy rows only: the final "#### N" is off by one, the equation lines are left as is


Style = Literal["short", "explained"]


@dataclass(frozen=True)
class _Problem:
    question: str
    start: int
    steps: tuple[tuple[int, int], ...]  # (index into VERBS, operand)
    name: str
    item: str


def _make_problem(rng: random.Random, style: Style = "short", steps: tuple[int, int] = (3, 5)) -> _Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if style == "short":
        start = rng.randint(6, 20)
        operands = [rng.randint(1, min(9, start - 1))]
        if rng.random() < 0.5:  # two steps; start - first - second >= 0, so no variant goes negative
            operands.append(rng.randint(1, min(9, start - operands[0])))
    else:
        start = rng.randint(20, 40)
        low, operands = start, []  # low: the value if every step subtracted; operands keep it >= 0
        for _ in range(rng.randint(*steps)):
            operands.append(rng.randint(1, max(1, min(9, low - 1))))
            low -= operands[-1]
    steps = tuple((rng.randrange(len(VERBS)), n) for n in operands)
    sentences = [f"{name} has {start} {item}."]
    for k, (verb, n) in enumerate(steps):
        subject = f"Then {name}" if k else name
        sentences.append(f"{subject} {VERBS[verb].phrase.format(n=n, item=item)}.")
    sentences.append(f"How many {item} does {name} have now?")
    return _Problem(" ".join(sentences), start, steps, name, item)


def _solution(problem: _Problem, ops: Sequence[Op], style: Style = "short") -> tuple[list[str], int]:
    """Solution lines (``13-4=9`` per step, or narrated sentences for ``explained``) and the final value."""
    value, lines = problem.start, []
    name, item = problem.name, problem.item
    if style == "explained":
        lines.append(f"{name} starts with {value} {item}.")
    for (verb, n), op in zip(problem.steps, ops):
        new = value + n if op == "+" else value - n
        if style == "explained":
            how = "add" if op == "+" else "subtract"
            lines.append(
                f"{name} {VERBS[verb].phrase.format(n=n, item=item)}, so {how}: {value}{op}{n}={new}."
            )
        else:
            lines.append(f"{value}{op}{n}={new}")
        value = new
    if style == "explained":
        lines.append(f"So {name} has {value} {item} now.")
    return lines, value


def _teacher_ops(problem: _Problem, rng: random.Random) -> list[Op]:
    ops: list[Op] = []
    for verb, _ in problem.steps:
        op = VERBS[verb].op
        if rng.random() < VERBS[verb].confusion:
            op = "-" if op == "+" else "+"
        ops.append(op)
    return ops


def generate_rows(
    n: int,
    *,
    seed: int,
    noisy: bool = False,
    exclude: Collection[str] = (),
    style: Style = "short",
    steps: tuple[int, int] = (3, 5),
) -> list[dict[str, str]]:
    """``n`` rows ``{"question", "answer"}``; ``answer`` is the solution text ending in ``#### N``.

    Gold rows (``noisy=False``) are always right. Noisy rows hold the confused teacher's solution for the
    *same* questions as the gold rows of this seed. Questions in ``exclude`` are redrawn. ``style``: see the
    module docstring. ``steps``: the fewest and most steps of an ``explained`` problem (``short`` ones have
    one or two); fewer steps leave the SFT model right more often (each step can be confused).
    """
    if style not in ("short", "explained"):
        raise ValueError(f"generate_rows(style={style!r}): style is 'short' or 'explained'")
    if not 1 <= steps[0] <= steps[1]:
        raise ValueError(f"generate_rows(steps={steps!r}): need 1 <= fewest <= most steps")
    if n < 0:
        raise ValueError(f"generate_rows(n={n}): n must be >= 0")
    problem_rng = random.Random(f"{seed}/problems")
    teacher_rng = random.Random(f"{seed}/teacher")
    rows: list[dict[str, str]] = []
    budget = 100 * n + 100  # the problem space holds >10^5 questions; running out means exclude is too big
    while len(rows) < n:
        budget -= 1
        if budget < 0:
            raise RuntimeError(
                f"generate_rows: drew {100 * n + 100} problems but {n - len(rows)} more were all in exclude "
                f"({len(exclude)} questions); pass a smaller exclude set or ask for fewer rows"
            )
        problem = _make_problem(problem_rng, style, steps)
        if problem.question in exclude:
            continue
        ops = _teacher_ops(problem, teacher_rng) if noisy else [VERBS[v].op for v, _ in problem.steps]
        lines, final = _solution(problem, ops, style)
        if noisy and teacher_rng.random() < SLIP_PROB:
            final += 1 if final == 0 or teacher_rng.random() < 0.5 else -1
        rows.append({"question": problem.question, "answer": "\n".join([*lines, f"#### {final}"])})
    return rows


def write_word_problems(
    out_dir: str | Path,
    *,
    seed: int = 0,
    n_train: int = 4000,
    n_test: int = 256,
    n_sft: int = 4000,
    style: Style = "short",
    steps: tuple[int, int] = (3, 5),
) -> dict[str, Path]:
    """Write ``train.jsonl`` (gold), ``sft.jsonl`` (noisy teacher) and ``test.jsonl`` (gold, disjoint).

    Same arguments give byte-identical files. Returns ``{"train": path, "test": path, "sft": path}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kw = {"style": style, "steps": steps}
    train = generate_rows(n_train, seed=_split_seed(seed, "train"), **kw)
    sft = generate_rows(n_sft, seed=_split_seed(seed, "sft"), noisy=True, **kw)
    seen = {r["question"] for r in train} | {r["question"] for r in sft}
    test = generate_rows(n_test, seed=_split_seed(seed, "test"), exclude=seen, **kw)
    paths = {}
    for split, rows in (("train", train), ("test", test), ("sft", sft)):
        paths[split] = out / f"{split}.jsonl"
        _write_jsonl(paths[split], rows)
    return paths


def corpus(rows: Iterable[dict[str, str]]) -> Iterator[str]:
    """One text per row (question, newline, solution): what a tokenizer for this task must cover."""
    for row in rows:
        yield f"{row['question']}\n{row['answer']}"


def _split_seed(seed: int, split: str) -> int:
    # A str seed goes through sha512 in random.Random, so this is stable across runs and platforms.
    return random.Random(f"{seed}/{split}").getrandbits(63)


def _write_jsonl(path: Path, rows: Iterable[dict[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

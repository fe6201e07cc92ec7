"""Word problems with a missing number, for learning to ask (the ``learn_to_ask`` recipe, docs/recipes.md).

A problem is a start (6-20) and one step (1-9), ``Leo has 8 apples. Leo wins 3 more apples. How many apples does Leo have
now?``; a third of them hide the start (``Leo has some apples.``), a third the step's amount (``Leo wins some
more apples.``). The right move is to ask for the missing number, ``How many apples does Leo have at
first?`` or ``How many apples does Leo win?``, and answer once it is known, ``8+3=11`` then ``#### 11``; a
problem with nothing missing is answered at once.

Three uses of the same problems:

- the **user** (``envs/ask_user.py``): a simulated person who answers the right question with the number,
  says "You know that already." to a question about a number in the problem, and scores the answer;
- the **logs**: dialogues of a noisy expert with that user, the offline data a deployed assistant leaves
  behind. On a problem with a missing number the expert asks for it 40% of the time, first asks about the
  other number 10% (then the right one), and guesses 50% (a made-up number in the right calculation); on a
  complete problem it answers 75% of the time and asks a needless question first 25%;
- **Learn-to-Ask samples** (Wang et al. 2025, arXiv:2510.25441: learn a proactive assistant from offline
  logs, without a user simulator): every assistant turn of a logged dialogue becomes a single-turn sample,
  the dialogue so far as the prompt, grounded by what the log says the situation was (``missing``: the
  number still unknown at that point, or null) and the problem's true ``answer``, so that the ``ask`` reward
  (``rewards/ask.py``) scores any response the policy gives there.

Parsing a turn (``parse_turn``) is shared by the user, the reward and the tests: an answer is a ``#### N``
line; a question is about the start when it says "at first", else about the step when it names the step's
verb; anything else is neither.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trivium.tasks.word_problems import ITEMS, NAMES, VERBS

__all__ = [
    "KNOWN",
    "Problem",
    "generate_problems",
    "parse_turn",
    "reply",
    "write_ask",
]

Slot = Literal["start", "step"]
KNOWN = "You know that already."
NEITHER = "Ask for the missing number, or answer."
_ANSWER = re.compile(r"####\s*(-?\d+)")


@dataclass(frozen=True)
class Problem:
    name: str
    item: str
    start: int
    verb: int  # index into word_problems.VERBS
    amount: int
    missing: Slot | None  # the number the problem does not say

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Problem:
        missing = row.get("missing")
        if missing not in (None, "start", "step"):
            raise ValueError(f"field 'missing' must be 'start', 'step' or null, got {missing!r}")
        return cls(row["name"], row["item"], int(row["start"]), int(row["verb"]), int(row["amount"]), missing)

    def row(self) -> dict[str, Any]:
        return {
            "question": self.question(),
            "name": self.name,
            "item": self.item,
            "start": self.start,
            "verb": self.verb,
            "amount": self.amount,
            "missing": self.missing,
            "answer": self.value(),
        }

    def _step(self, amount: int | str) -> str:
        return VERBS[self.verb].phrase.format(n=amount, item=self.item)

    def question(self) -> str:
        start = "some" if self.missing == "start" else self.start
        amount = "some" if self.missing == "step" else self.amount
        return (
            f"{self.name} has {start} {self.item}. {self.name} {self._step(amount)}. "
            f"How many {self.item} does {self.name} have now?"
        )

    def value(self) -> int:
        sign = 1 if VERBS[self.verb].op == "+" else -1
        return self.start + sign * self.amount

    def solution(self, start: int | None = None, amount: int | None = None) -> str:
        """The worked answer (with other numbers: a guess)."""
        start = self.start if start is None else start
        amount = self.amount if amount is None else amount
        op = VERBS[self.verb].op
        value = start + amount if op == "+" else start - amount
        return f"{start}{op}{amount}={value}\n#### {value}"

    def base_verb(self) -> str:
        """The step's verb as the question uses it: ``wins`` -> ``win``, ``gives away`` -> ``give away``."""
        first, _, rest = VERBS[self.verb].phrase.partition(" {n}")[0].partition(" ")
        return " ".join([first.removesuffix("s"), rest]).strip()

    def ask(self, slot: Slot) -> str:
        if slot == "start":
            return f"How many {self.item} does {self.name} have at first?"
        return f"How many {self.item} does {self.name} {self.base_verb()}?"

    def fact(self, slot: Slot) -> str:
        if slot == "start":
            return f"{self.name} has {self.start} {self.item} at first."
        return f"{self.name} {self._step(self.amount)}."


def parse_turn(text: str, problem: Problem) -> tuple[str, Any]:
    """``("answer", N)``, ``("ask", "start" | "step")`` or ``("other", None)`` (module docstring)."""
    answers = _ANSWER.findall(text)
    if answers:
        return "answer", int(answers[-1])
    if "?" in text:
        lowered = text.lower()
        if "at first" in lowered:
            return "ask", "start"
        if re.search(rf"\b{re.escape(problem.base_verb())}\b", lowered):
            return "ask", "step"
    return "other", None


def reply(problem: Problem, text: str, revealed: set[str]) -> str:
    """What the user says to a turn that is not an answer; ``revealed`` (updated) holds the numbers told."""
    kind, slot = parse_turn(text, problem)
    if kind != "ask":
        return NEITHER
    if slot != problem.missing or slot in revealed:
        return KNOWN
    revealed.add(slot)
    return problem.fact(slot)


def generate_problems(n: int, seed: int) -> list[Problem]:
    rng = random.Random(f"ask:{seed}")
    out = []
    for _ in range(n):
        start = rng.randint(6, 20)
        missing = rng.choice([None, "start", "step"])
        out.append(  # one-digit amounts: the arithmetic a 1M-parameter model gets right, so asking decides
            Problem(
                rng.choice(NAMES),
                rng.choice(ITEMS),
                start,
                rng.randrange(len(VERBS)),
                rng.randint(1, min(9, start - 1)),
                missing,
            )
        )
    return out


def expert_dialogue(problem: Problem, rng: random.Random) -> list[dict[str, str]]:
    """A noisy expert's logged dialogue with the user (module docstring)."""
    messages = [{"role": "user", "content": problem.question()}]
    revealed: set[str] = set()

    def ask(slot: Slot) -> None:
        text = problem.ask(slot)
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": reply(problem, text, revealed)})

    roll = rng.random()
    if problem.missing is None:
        if roll < 0.25:
            ask(rng.choice(["start", "step"]))
        answer = problem.solution()
    else:
        other: Slot = "step" if problem.missing == "start" else "start"
        if roll < 0.5:  # guesses: a made-up number where the missing one goes
            guess = rng.randint(problem.amount + 1, 20) if problem.missing == "start" else rng.randint(1, 5)
            answer = problem.solution(**{"start" if problem.missing == "start" else "amount": guess})
        else:
            if roll < 0.6:
                ask(other)
            ask(problem.missing)
            answer = problem.solution()
    messages.append({"role": "assistant", "content": answer})
    return messages


def learn_to_ask_samples(problem: Problem, dialogue: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One sample per assistant turn of a logged dialogue: the dialogue before it, and what was missing then."""
    out = []
    revealed: set[str] = set()
    for k, message in enumerate(dialogue):
        if message["role"] != "assistant":
            if problem.missing and message["content"] == problem.fact(problem.missing):
                revealed.add(problem.missing)
            continue
        missing = problem.missing if problem.missing and problem.missing not in revealed else None
        out.append(
            {"messages": dialogue[:k], "missing": missing, "answer": problem.value(), **_fields(problem)}
        )
    return out


def _fields(problem: Problem) -> dict[str, Any]:
    row = problem.row()
    return {k: row[k] for k in ("name", "item", "start", "verb", "amount")}


def write_ask(
    folder: str | Path, n_train: int = 2000, n_test: int = 300, n_logs: int = 3000, seed: int = 0
) -> dict[str, int]:
    """``train.jsonl`` and ``test.jsonl`` (problems for the user simulator), ``logs.jsonl`` (the expert's
    dialogues: ``messages``, SFT data), ``learn_to_ask.jsonl`` (the samples made from them); rows written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    test = generate_problems(n_test, seed + 1)
    held_out = {p.question() for p in test}
    train = [p for p in generate_problems(n_train + n_logs + n_test, seed) if p.question() not in held_out]
    logs_problems, train = train[:n_logs], train[n_logs : n_logs + n_train]
    rng = random.Random(f"ask-expert:{seed}")
    dialogues = [(p, expert_dialogue(p, rng)) for p in logs_problems]
    files = {
        "train.jsonl": [p.row() for p in train],
        "test.jsonl": [p.row() for p in test],
        "logs.jsonl": [{"messages": d} for _, d in dialogues],
        "learn_to_ask.jsonl": [s for p, d in dialogues for s in learn_to_ask_samples(p, d)],
    }
    for name, rows in files.items():
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {name: len(rows) for name, rows in files.items()}

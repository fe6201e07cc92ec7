"""Writes data/guess.jsonl (numbers to guess) and data/words.jsonl (letters to count): 64 rows each, seeded."""

import json
import random
from pathlib import Path

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "lemon",
    "piano",
    "candle",
    "sun",
    "garden",
    "window",
    "moon",
    "bread",
    "orange",
    "cat",
    "planet",
]


def main() -> None:
    rng = random.Random(0)
    data = Path(__file__).resolve().parent / "data"
    data.mkdir(exist_ok=True)
    guess = [{"target": rng.randint(1, 8)} for _ in range(64)]
    words = [rng.choice(WORDS) for _ in range(64)]
    count = [{"question": f"How many letters are in the word {w}?", "answer": str(len(w))} for w in words]
    for name, rows in (("guess", guess), ("words", count)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()

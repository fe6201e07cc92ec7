"""Shape boards: which colour has the most shapes? A visual task with levels, for vision-language RFT.

A row is ``{"image": "data:image/png;base64,...", "question": "Which colour has the most shapes?",
"answer": "blue", "level": 2}``. The canvas is ``CANVAS`` x ``CANVAS`` pixels, a ``GRID`` x ``GRID`` board;
each shape (a square, a disc or a triangle, red, green or blue, drawn a little off-centre, in a slightly
varied size and shade) fills most of one cell. With the tiny Qwen2-VL of ``trivium make-tiny --vlm``
(14-pixel patches merged 2 x 2) a 56-pixel cell is 2 x 2 visual tokens.

Difficulty (``level``): 1 is one shape (its colour), 2 is two shapes of one colour and one of another, 3 is
two of one colour and one each of the two others (every cell filled): more shapes to tell apart and
compare. There is never a tie. Images travel inside the rows as PNG data URLs (about 0.5 KB each), so a
task file is self-contained.

The "confused teacher" (``noisy=True``, SFT demonstrations): when the answer is green it names the next
colour (blue) half of the time, when it is blue it names red 80% of the time (``CONFUSION``): a model
trained on it answers red right and confuses the others while still giving the right colour sometimes, a
gap that the exact reward can close (as in the quickstart).

Measured (``examples/vision``, SFT on gold rows, 150 steps of 64): a 4 x 4 board (one visual token per
cell) stayed at chance even with one shape, a 2 x 2 board reached 0.65-0.70 on all levels; hence ``GRID``.

Every random stream comes from ``(seed, label)``; the test split holds no image of the train or SFT splits.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Collection
from pathlib import Path

from trivium.models.vision import data_url

__all__ = ["COLOURS", "CONFUSION", "generate_rows", "render", "write_shapes"]

CANVAS = 112
GRID = 2
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220)}
KINDS = ("square", "disc", "triangle")
QUESTION = "Which colour has the most shapes?"
LEVELS = {1: (1, 0), 2: (2, 1), 3: (2, 2)}  # (shapes of the winning colour, shapes of the other colours)
CONFUSION = {"red": 0.0, "green": 0.5, "blue": 0.8}  # chance that the teacher names the next colour instead


def render(shapes: list[tuple[int, str, str]], rng: random.Random | None = None) -> bytes:
    """PNG bytes of a board with ``(cell, colour, kind)`` shapes (cell = row * GRID + column). ``rng``: draw
    each shape a little off its cell's centre, smaller or larger, and its colour a little off (so boards
    with the same shapes in the same cells differ)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (CANVAS, CANVAS), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    size = CANVAS // GRID
    for cell, colour, kind in shapes:
        x, y = (cell % GRID) * size, (cell // GRID) * size
        margin = rng.randint(2, 6) if rng else 3
        dx, dy = (rng.randint(-2, 2), rng.randint(-2, 2)) if rng else (0, 0)
        box = (x + margin + dx, y + margin + dy, x + size - margin - 1 + dx, y + size - margin - 1 + dy)
        fill = COLOURS[colour]
        if rng is not None:
            fill = tuple(min(255, max(0, v + rng.randint(-25, 25))) for v in fill)
        if kind == "square":
            draw.rectangle(box, fill=fill)
        elif kind == "disc":
            draw.ellipse(box, fill=fill)
        else:
            draw.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=fill)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def generate_rows(
    n: int, seed: int, levels: Collection[int] = (1, 2, 3), noisy: bool = False, exclude: Collection[str] = ()
) -> list[dict]:
    """``n`` rows over ``levels``, in turn; ``noisy``: the confused teacher's answers; ``exclude``: images
    (data URLs) not to draw again."""
    if n < 0 or not levels or any(level not in LEVELS for level in levels):
        raise ValueError(
            f"generate_rows(n={n}, levels={levels!r}): need n >= 0 and levels among {sorted(LEVELS)}"
        )
    rng = random.Random(f"{seed}:shapes")
    teacher = random.Random(f"{seed}:teacher")
    seen = set(exclude)
    rows: list[dict] = []
    levels = sorted(levels)
    names = list(COLOURS)
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 20 * n + 1000:
            raise RuntimeError(f"generate_rows(n={n}): too few distinct boards left after {len(rows)} rows")
        level = levels[len(rows) % len(levels)]
        most, others = LEVELS[level]
        winner = rng.choice(names)
        losers = [c for c in names if c != winner]
        colours = [winner] * most + [rng.choice(losers) for _ in range(others)]
        if any(colours.count(c) >= most for c in losers):  # a tie: no colour has the most
            continue
        cells = rng.sample(range(GRID * GRID), len(colours))
        shapes = sorted((cell, colour, rng.choice(KINDS)) for cell, colour in zip(cells, colours))
        image = data_url(render(shapes, rng))
        if image in seen:
            continue
        seen.add(image)
        answer = winner
        if noisy and teacher.random() < CONFUSION[winner]:
            answer = names[(names.index(winner) + 1) % len(names)]
        rows.append({"image": image, "question": QUESTION, "answer": answer, "level": level})
    return rows


def write_shapes(
    folder: str | Path, seed: int = 0, n_train: int = 4000, n_sft: int = 4000, n_test: int = 256
) -> dict[str, Path]:
    """``train.jsonl`` (gold), ``sft.jsonl`` (the confused teacher) and ``test.jsonl`` (held out) in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    train = generate_rows(n_train, seed * 3 + 0)
    sft = generate_rows(n_sft, seed * 3 + 1, noisy=True)
    test = generate_rows(n_test, seed * 3 + 2, exclude={r["image"] for r in train + sft})
    out = {}
    for name, rows in (("train", train), ("sft", sft), ("test", test)):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out[name] = path
    return out

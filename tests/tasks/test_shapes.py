"""tasks/shapes.py: the boards say what the answers say, splits are disjoint, the teacher is confused as told."""

import base64
import io

import numpy as np
from PIL import Image

from trivium.tasks.shapes import CANVAS, COLOURS, CONFUSION, GRID, generate_rows


def colours_on_the_board(row):
    """The colour of each filled cell, read back from the image's pixels (nearest named colour)."""
    data = base64.b64decode(row["image"].split(",", 1)[1])
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    size = CANVAS // GRID
    found = []
    for r in range(GRID):
        for c in range(GRID):
            centre = pixels[
                r * size + size // 2 + 4, c * size + size // 2
            ]  # below the middle: inside a triangle
            if (centre > 240).all():
                continue
            found.append(min(COLOURS, key=lambda name: np.abs(centre - COLOURS[name]).sum()))
    return found


def test_the_gold_answer_is_the_colour_with_the_most_shapes():
    rows = generate_rows(150, seed=3)
    for row in rows:
        found = colours_on_the_board(row)
        counts = {c: found.count(c) for c in COLOURS}
        assert counts[row["answer"]] > max(v for c, v in counts.items() if c != row["answer"]), counts
        assert len(found) == {1: 1, 2: 3, 3: 4}[row["level"]]
    assert {r["level"] for r in rows} == {1, 2, 3}


def test_the_confused_teacher_names_the_wrong_colour_as_often_as_told():
    gold = generate_rows(1200, seed=1)
    noisy = generate_rows(1200, seed=1, noisy=True)
    for colour, rate in CONFUSION.items():
        pairs = [(g, n) for g, n in zip(gold, noisy) if g["answer"] == colour]
        assert all(g["image"] == n["image"] for g, n in pairs)
        wrong = sum(n["answer"] != colour for _, n in pairs) / len(pairs)
        assert abs(wrong - rate) < 0.05, (colour, wrong)


def test_excluded_images_are_not_drawn_again():
    first = generate_rows(50, seed=0)
    again = generate_rows(50, seed=0, exclude={r["image"] for r in first})
    assert not {r["image"] for r in first} & {r["image"] for r in again}

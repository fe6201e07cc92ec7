"""FrozenLake as a text game (``"frozenlake"``): gymnasium's own ``FrozenLake-v1`` behind ``GymnasiumEnv``.

Task row: either ``map``, a list of equal-length strings over ``S F H G`` (one ``S``, at least one ``G``),
e.g. ``["SFFF", "FHFH", "FFFH", "HFFG"]``; or ``size`` and ``seed`` (optional ``p``, the chance a cell is
frozen, default 0.8), from which gymnasium's ``generate_random_map`` draws a square map that has a path
from S to G. The same (size, seed, p) always gives the same map.

Observation: every turn is the grid, one row per line, cells separated by spaces, the player's cell
shown as ``P``. The first turn starts with a short instruction. Measured with the word-problem tokenizer
of ``make_tiny`` (which has learnt no grids): a 4x4 turn is 31 tokens, the first turn 116, an invalid-move
reply 72; the 6-move solution of the map below sends 116 + 5 * 31 tokens of observations, which leaves
room in a 512-token context for the chat template and the moves. Longer episodes need a lower
``max_steps`` (or a workflow that does not keep the whole transcript). Example of a first turn::

    Walk from S to G. F: ice, H: hole, P: you.
    Answer with one move: left, down, right or up.

    P F F F
    F H F H
    F F F H
    H F F G

Action format: the move is the last line ``Action: <move>`` of the turn if there is one, else the last of
the words ``left``, ``down``, ``right``, ``up`` (whole words, any case) anywhere in it, so both a bare
``right`` and some reasoning ending in a move work, and ``Action: right`` wins over directions named in
reasoning after it. A turn with no move is invalid: the reply says so, the player stays, and the turn
counts toward ``max_steps``.

Image observations (``env_args: {observation: image}``, for a vision-language model): every turn is the
map drawn as a picture (``render_image``: ice light blue, holes dark, the goal green, the player a red
square), ``cell_px`` pixels a cell (default 28: one visual token per cell for Qwen2-VL, whose tokens
cover 28x28 pixels), after the first turn's instruction (``IMAGE_INSTRUCTION``). The workflow stores
each picture once in the run's image store; the experiences refer to them.

Reflect and retry (``workflow: reflect_retry``): ``diagnose`` walks a failed episode's moves over the map
(non-slippery ice only) and names the mistake: the move into a hole; else, for an episode that ran out of
turns, its first wasted turn (no move, a move into the edge, or back onto a cell already visited). The
retry avoids that move from that cell.

Reward: 1.0 on reaching G, 0.0 otherwise (a hole or the step limit ends the episode with 0). ``info``:
``success`` (1.0 when G was reached), ``steps``, ``invalid_actions``, ``return``.
``shortest_path(desc)`` solves a map (BFS), for demonstrations and checks.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from trivium.envs.base import Diagnosis, image_part, register_env
from trivium.envs.gym_adapter import GymnasiumEnv
from trivium.types import Task

__all__ = [
    "ACTIONS",
    "FrozenLakeEnv",
    "generate_map",
    "map_from_row",
    "parse_map",
    "parse_move",
    "render_grid",
    "render_image",
    "shortest_path",
]

#: Move words in gymnasium's action order (0 left, 1 down, 2 right, 3 up).
ACTIONS = ("left", "down", "right", "up")
_DELTAS = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_CELLS = frozenset("SFHG")
_ACTION_LINE = re.compile(r"^\s*action\s*:\s*(left|down|right|up)\b", re.IGNORECASE | re.MULTILINE)
_ACTION_WORD = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)

INSTRUCTION = "Walk from S to G. F: ice, H: hole, P: you.\nAnswer with one move: left, down, right or up."
ACTION_HELP = "Use left, down, right or up."
IMAGE_INSTRUCTION = "Walk to the green cell. Dark cells are holes, you are red.\nAnswer with one move: left, down, right or up."
LOCAL_VIEW_INSTRUCTION = (
    "Walk to the green cell, down and to the right. You see the cells around you: dark cells are holes, grey "
    "is the edge, you are red in the middle.\nAnswer with one move: left, down, right or up."
)

#: Cell colours of ``render_image`` (RGB).
COLOURS = {
    "S": (200, 228, 250),
    "F": (200, 228, 250),
    "H": (25, 30, 60),
    "G": (40, 170, 70),
    "P": (220, 40, 40),
    "W": (120, 120, 120),  # beyond the map's edge (a local view)
}
_GRID_LINE = (150, 160, 175)


def parse_map(value: Any, where: str = "field 'map'") -> list[str]:
    """A map as a list of row strings, checked: equal lengths, only ``S F H G``, one S, at least one G."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ValueError(
            f"{where} must be a non-empty list of row strings like ['SFFF', 'FHFH', 'FFFH', 'HFFG'], "
            f"got {str(value)[:80]!r}"
        )
    rows = list(value)
    bad_rows = [k for k, r in enumerate(rows) if not isinstance(r, str) or not r]
    if bad_rows:
        raise ValueError(f"{where}: rows {bad_rows} are not non-empty strings; got {rows!r:.120}")
    widths = sorted({len(r) for r in rows})
    if len(widths) > 1:
        raise ValueError(
            f"{where}: rows must all have the same length, got lengths {[len(r) for r in rows]}; "
            "pad or fix the ragged rows"
        )
    unknown = sorted(set("".join(rows)) - _CELLS)
    if unknown:
        raise ValueError(f"{where}: unknown cells {unknown}; use S (start), F (frozen), H (hole), G (goal)")
    cells = "".join(rows)
    if cells.count("S") != 1 or "G" not in cells:
        raise ValueError(
            f"{where}: needs exactly one S and at least one G, got {cells.count('S')} S and "
            f"{cells.count('G')} G in {rows}"
        )
    return rows


def generate_map(size: int, seed: int, p: float = 0.8) -> list[str]:
    """gymnasium's ``generate_random_map``: a ``size`` x ``size`` map with a path from S to G."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    return generate_random_map(size=size, p=p, seed=seed)


def map_from_row(data: Mapping[str, Any], default_p: float = 0.8, task_id: str = "") -> list[str]:
    """The map of a task row: its ``map``, or one generated from ``size``, ``seed`` and ``p``."""
    where = f"task {task_id!r}" if task_id else "task row"
    if data.get("map") is not None:
        desc = parse_map(data["map"], f"{where}: field 'map'")
        size = data.get("size")
        if size is not None and (len(desc), len(desc[0])) != (size, size):
            raise ValueError(
                f"{where}: field 'size' is {size!r} but field 'map' is {len(desc)}x{len(desc[0])}; "
                "drop 'size' or make them agree"
            )
        return desc
    if data.get("size") is None:
        raise ValueError(
            f"{where}: frozenlake needs field 'map' (a list of row strings) or fields 'size' and 'seed' "
            f"(to generate one); the row has {sorted(data)}"
        )
    size, seed, p = data["size"], data.get("seed"), data.get("p", default_p)
    if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= 32:
        raise ValueError(f"{where}: field 'size' must be an integer from 2 to 32, got {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(
            f"{where}: field 'seed' must be an integer when the map is generated from 'size' (so every "
            f"run of the task gets the same map), got {seed!r}"
        )
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.5 <= p <= 1:
        raise ValueError(
            f"{where}: field 'p' (or env arg p: the chance a cell is frozen) must be a number from 0.5 to 1, got {p!r}; "
            "below 0.5 solvable maps get rare and generation can take very long"
        )
    return generate_map(size, seed, float(p))


def render_grid(desc: Sequence[str], row: int, col: int) -> str:
    """The grid with ``P`` at (row, col), one row per line, cells separated by spaces."""
    return "\n".join(
        " ".join("P" if (r, c) == (row, col) else cell for c, cell in enumerate(line))
        for r, line in enumerate(desc)
    )


def render_image(desc: Sequence[str], row: int, col: int, cell_px: int = 28, view: int | None = None):
    """The map as a PIL RGB image, ``cell_px`` pixels a cell, the player (red) at (row, col). ``view`` (odd):
    only the ``view`` x ``view`` cells around the player, the player in the middle, cells beyond the map's
    edge drawn as walls (grey)."""
    from PIL import Image, ImageDraw

    if view is None:
        cells = [[(r, c) for c in range(len(desc[0]))] for r in range(len(desc))]
    else:
        k = view // 2
        cells = [[(row + dr, col + dc) for dc in range(-k, k + 1)] for dr in range(-k, k + 1)]
    image = Image.new("RGB", (len(cells[0]) * cell_px, len(cells) * cell_px), _GRID_LINE)
    draw = ImageDraw.Draw(image)
    inset = max(1, cell_px // 6)
    for i, line in enumerate(cells):
        for j, (r, c) in enumerate(line):
            inside = 0 <= r < len(desc) and 0 <= c < len(desc[0])
            x, y = j * cell_px, i * cell_px
            fill = COLOURS[desc[r][c]] if inside else COLOURS["W"]
            draw.rectangle([x + 1, y + 1, x + cell_px - 2, y + cell_px - 2], fill=fill)
            if (r, c) == (row, col):
                draw.rectangle(
                    [x + inset, y + inset, x + cell_px - 1 - inset, y + cell_px - 1 - inset],
                    fill=COLOURS["P"],
                )
    return image


def shortest_path(desc: Sequence[str]) -> list[str] | None:
    """The fewest moves from S to the nearest G avoiding holes (BFS; ties broken in ``ACTIONS`` order).

    Returns move words (``[]`` never happens: S is not G), or None when no G is reachable.
    """
    rows, cols = len(desc), len(desc[0])
    start = next((r, c) for r in range(rows) for c in range(cols) if desc[r][c] == "S")
    came_from: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == "G":
            path: list[str] = []
            while came_from[cell] is not None:
                cell, move = came_from[cell]
                path.append(move)
            return path[::-1]
        for move in ACTIONS:
            dr, dc = _DELTAS[move]
            nxt = (cell[0] + dr, cell[1] + dc)
            if (
                0 <= nxt[0] < rows
                and 0 <= nxt[1] < cols
                and nxt not in came_from
                and desc[nxt[0]][nxt[1]] != "H"
            ):
                came_from[nxt] = (cell, move)
                queue.append(nxt)
    return None


def parse_move(text: str) -> int | None:
    """The action index of the move in ``text`` (module docstring: last ``Action:`` line, else last word)."""
    lines = _ACTION_LINE.findall(text)
    words = lines or _ACTION_WORD.findall(text)
    return ACTIONS.index(words[-1].lower()) if words else None


@register_env("frozenlake")
class FrozenLakeEnv(GymnasiumEnv):
    """FrozenLake-v1 from the task row's map (see the module docstring for row fields and formats).

    Args:
        is_slippery: gymnasium's slippery ice (a move may go sideways); off by default so a plan works.
        max_steps: turns per episode; default 2 * rows * cols (32 on 4x4).
        invalid_action_reward: reward of a turn without a move.
        p: the frozen-cell chance for generated maps whose row has no ``p``.
        instruction: the first turn's rules; None or "" leaves only the grid. The default ``INSTRUCTION``
            (cell letters) becomes ``IMAGE_INSTRUCTION`` (cell colours) with image observations.
        observation: ``"text"`` (the grid as characters) or ``"image"`` (a picture: ``render_image``; needs a
            vision-language model).
        cell_px: pixels per cell of the picture (8 to 256).
        view: with pictures, show only the ``view`` x ``view`` cells around the player (odd, 3 to 15), the
            player in the middle (``LOCAL_VIEW_INSTRUCTION``); None: the whole map.
    """

    def __init__(
        self,
        is_slippery: bool = False,
        max_steps: int | None = None,
        invalid_action_reward: float = 0.0,
        p: float = 0.8,
        instruction: str | None = INSTRUCTION,
        observation: str = "text",
        cell_px: int = 28,
        view: int | None = None,
    ):
        if observation not in ("text", "image"):
            raise ValueError(f"env_args.observation must be 'text' or 'image', got {observation!r}")
        if isinstance(cell_px, bool) or not isinstance(cell_px, int) or not 8 <= cell_px <= 256:
            raise ValueError(f"env_args.cell_px must be an integer from 8 to 256, got {cell_px!r}")
        if view is not None and (
            isinstance(view, bool) or not isinstance(view, int) or view % 2 == 0 or not 3 <= view <= 15
        ):
            raise ValueError(f"env_args.view must be an odd integer from 3 to 15 (or unset), got {view!r}")
        if view is not None and observation != "image":
            raise ValueError("env_args.view shows part of the map in a picture: set observation: image too")
        if instruction == INSTRUCTION and observation == "image":
            instruction = IMAGE_INSTRUCTION if view is None else LOCAL_VIEW_INSTRUCTION
        self.view = view
        self.observation = observation
        self.cell_px = cell_px
        super().__init__(
            "FrozenLake-v1",
            max_steps=1 if max_steps is None else max_steps,  # None: set per map in reset
            invalid_action_reward=invalid_action_reward,
            action_help=ACTION_HELP,
            instruction=instruction,
        )
        self.is_slippery = bool(is_slippery)
        self._fixed_max_steps = max_steps
        self.default_p = p
        self.desc: list[str] = []

    def reset(self, task: Task) -> str:
        self.desc = map_from_row(task.data, self.default_p, task.task_id)
        if self._fixed_max_steps is None:
            self.max_steps = 2 * len(self.desc) * len(self.desc[0])
        return super().reset(task)

    def task_make_kwargs(self, task: Task) -> dict[str, Any]:
        return {"desc": self.desc, "is_slippery": self.is_slippery}

    def describe(self, observation: Any, info: Mapping[str, Any]) -> str | list[dict[str, Any]]:
        row, col = divmod(int(observation), len(self.desc[0]))
        if self.observation == "image":
            return [image_part(render_image(self.desc, row, col, self.cell_px, self.view))]
        return render_grid(self.desc, row, col)

    def parse_action(self, text: str) -> int | None:
        return parse_move(text)

    def diagnose(self, actions: Sequence[str]) -> Diagnosis | None:
        """The failed episode's mistake (see the module docstring); None on slippery ice (a move may not
        have gone where it was meant to), for an episode that reached G, or one with no mistake found."""
        if self.is_slippery or not self.desc:
            return None
        rows, cols = len(self.desc), len(self.desc[0])
        pos = next((r, c) for r in range(rows) for c in range(cols) if self.desc[r][c] == "S")
        seen, wasted = {pos}, None
        for k, text in enumerate(actions):
            move = parse_move(text)
            if move is None:
                wasted = wasted or Diagnosis(k, f"turn {k + 1} named no move", repeats=_no_move)
                continue
            word = ACTIONS[move]
            dr, dc = _DELTAS[word]
            nxt = (min(max(pos[0] + dr, 0), rows - 1), min(max(pos[1] + dc, 0), cols - 1))
            where = f"turn {k + 1}: {word} from row {pos[0] + 1}, column {pos[1] + 1}"
            cell = self.desc[nxt[0]][nxt[1]]
            if cell == "H":
                return Diagnosis(k, f"{where} walks into a hole", repeats=_move_is(move))
            if cell == "G":
                return None
            if nxt in seen and wasted is None:
                what = "runs into the edge" if nxt == pos else "goes back to a cell already visited"
                wasted = Diagnosis(k, f"{where} {what}", repeats=_move_is(move))
            seen.add(nxt)
            pos = nxt
        return wasted


def _no_move(text: str) -> bool:
    return parse_move(text) is None


def _move_is(move: int):
    """Whether a turn text names ``move`` (the mistake ``diagnose`` found)."""
    return lambda text: parse_move(text) == move

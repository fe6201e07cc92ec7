import pytest

from trivium.envs.base import make_env
from trivium.envs.frozenlake import (
    ACTIONS,
    FrozenLakeEnv,
    map_from_row,
    parse_map,
    parse_move,
    render_grid,
    shortest_path,
)
from trivium.types import Task

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]
DELTAS = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def task(**data):
    return Task(task_id="lake:0", data=data, workflow="multi_turn", reward_fn="")


def player(grid_text):
    """(row, col) of P in an observation, read back from the text the model sees."""
    rows = [line.split(" ") for line in grid_text.strip().splitlines()[-len(MAP) :]]
    return next((r, c) for r, row in enumerate(rows) for c, cell in enumerate(row) if cell == "P")


def walk(desc, moves):
    """The cell reached by following ``moves`` from S (a reference independent of gymnasium)."""
    r, c = next((r, row.index("S")) for r, row in enumerate(desc) if "S" in row)
    for m in moves:
        r, c = r + DELTAS[m][0], c + DELTAS[m][1]
    return r, c


def test_registered_under_its_name():
    env = make_env("frozenlake")
    assert isinstance(env, FrozenLakeEnv) and env.name == "frozenlake"


def test_first_turn_has_instruction_and_grid_with_player_on_start():
    env = make_env("frozenlake")
    text = env.reset(task(map=MAP))
    assert "left, down, right or up" in text
    grid = text.split("\n\n")[-1]
    assert grid.splitlines() == [" ".join(row) for row in ["PFFF", *MAP[1:]]]
    assert env.max_steps == 2 * 4 * 4


def test_shortest_path_reaches_goal_with_reward_one():
    path = shortest_path(MAP)
    # Manhattan distance S(0,0) -> G(3,3) is 6, a lower bound, so a 6-move path is shortest.
    assert len(path) == 6 and walk(MAP, path) == (3, 3)
    env = make_env("frozenlake")
    env.reset(task(map=MAP))
    results = [env.step(move) for move in path]
    assert [r.done for r in results] == [False] * 5 + [True]
    assert [r.reward for r in results] == [0.0] * 5 + [1.0]
    assert results[-1].info["success"] == 1.0 and results[-1].info["steps"] == 6.0
    for k, r in enumerate(results[:-1]):
        assert player(r.observation) == walk(MAP, path[: k + 1])


def test_hole_ends_with_zero():
    env = make_env("frozenlake")
    env.reset(task(map=MAP))
    assert walk(MAP, ["right", "down"]) == (1, 1) and MAP[1][1] == "H"
    assert not env.step("right").done
    result = env.step("down")
    assert result.done and result.reward == 0.0 and result.info["success"] == 0.0
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("up")


def test_invalid_action_keeps_player_and_names_moves():
    env = FrozenLakeEnv(invalid_action_reward=-0.5)
    env.reset(task(map=MAP))
    env.step("right")
    result = env.step("I would rather not move")
    assert "Invalid action" in result.observation and "left, down, right or up" in result.observation
    assert player(result.observation) == (0, 1)
    assert result.reward == -0.5 and not result.done
    assert result.info["invalid_actions"] == 1.0 and result.info["steps"] == 2.0


def test_step_limit_counts_invalid_turns():
    env = FrozenLakeEnv(max_steps=3)
    env.reset(task(map=MAP))
    assert [env.step(t).done for t in ("left", "??", "up")] == [False, False, True]


@pytest.mark.parametrize(
    ("text", "move"),
    [
        ("right", "right"),
        ("  UP.", "up"),
        ("left is a hole, so down", "down"),  # the last move word
        ("Action: right\nbecause left is a hole", "right"),  # an Action: line wins
        ("Action: up\nAction: left", "left"),
        ("upward and onward", None),  # whole words only
        ("", None),
    ],
)
def test_parse_move(text, move):
    assert parse_move(text) == (None if move is None else ACTIONS.index(move))


def test_generated_maps_are_deterministic_and_solvable():
    maps = [map_from_row({"size": 5, "seed": s}) for s in range(12)]
    assert maps == [map_from_row({"size": 5, "seed": s}) for s in range(12)]
    assert len({tuple(m) for m in maps}) > 1
    for m in maps:
        assert len(m) == 5 and {len(r) for r in m} == {5}
        path = shortest_path(parse_map(m))
        assert path is not None
        end = walk(m, path)
        assert m[end[0]][end[1]] == "G"


def test_episode_on_generated_map():
    env = make_env("frozenlake")
    text = env.reset(task(size=6, seed=1, p=0.7))
    desc = map_from_row({"size": 6, "seed": 1, "p": 0.7})
    assert text.endswith(render_grid(desc, 0, 0)) and env.max_steps == 72
    results = [env.step(f"Action: {m}") for m in shortest_path(desc)]
    assert results[-1].done and results[-1].reward == 1.0


def test_no_path_gives_none():
    assert shortest_path(["SH", "HG"]) is None


def test_slippery_runs_repeat_for_the_same_task():
    def trajectory():
        env = FrozenLakeEnv(is_slippery=True)
        env.reset(Task("lake:7", {"map": MAP, "seed": 7}, "w", ""))
        out = []
        for move in ["right", "down", "right", "down", "down", "right"]:
            result = env.step(move)
            out.append(player(result.observation) if not result.done else result.reward)
            if result.done:
                break
        return out

    assert trajectory() == trajectory()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, r"needs field 'map'.*'size' and 'seed'"),
        ({"map": "SFFF"}, r"field 'map' must be a non-empty list of row strings"),
        ({"map": ["SFFF", "FH", "FFFG"]}, r"field 'map': rows must all have the same length.*\[4, 2, 4\]"),
        ({"map": ["SFX", "FFG"]}, r"field 'map': unknown cells \['X'\]"),
        ({"map": ["FFF", "FFG"]}, r"exactly one S"),
        ({"map": MAP, "size": 5}, r"field 'size' is 5 but field 'map' is 4x4"),
        ({"size": 4}, r"field 'seed' must be an integer"),
        ({"size": 1, "seed": 0}, r"field 'size' must be an integer from 2 to 32"),
        ({"size": 4, "seed": 0, "p": 0.1}, r"field 'p'"),
    ],
)
def test_bad_rows_name_the_field(data, message):
    env = make_env("frozenlake")
    with pytest.raises(ValueError, match=message) as info:
        env.reset(task(**data))
    assert "lake:0" in str(info.value)


def play(moves, **env_args):
    """Play ``moves`` in a real episode on MAP; the env after it ended (or after the last move)."""
    env = FrozenLakeEnv(**env_args)
    env.reset(task(map=MAP))
    for k, move in enumerate(moves):
        result = env.step(move)
        if result.done:
            assert k == len(moves) - 1, f"the episode ended at move {k}, before the scripted {len(moves)}"
    env.close()
    return env, result


def test_diagnose_names_the_move_into_a_hole_and_how_to_recognise_it_again():
    env, result = play(["right", "Action: down"])
    assert result.done and result.reward == 0.0  # gymnasium agrees: the second move fell in
    d = env.diagnose(["right", "Action: down"])
    assert d.turn == 1 and "hole" in d.feedback and "row 1, column 2" in d.feedback
    assert d.repeats("down") and d.repeats("I think... Action: down")
    assert not d.repeats("right") and not d.repeats("no idea")


def test_diagnose_names_the_first_wasted_turn_of_an_episode_that_ran_out():
    for moves, turn, words in [
        (["hello", "right", "left"], 0, "no move"),  # no move at all
        (["up", "right", "right"], 0, "edge"),  # bumps into the top edge
        (["right", "left", "down"], 1, "already visited"),  # back to S
        (["down", "xyz", "up"], 1, "no move"),  # the first wasted turn wins over later ones
    ]:
        env, result = play(moves, max_steps=3)
        assert result.done and result.reward == 0.0 and result.info["success"] == 0.0
        d = env.diagnose(moves)
        assert (d.turn, words in d.feedback) == (turn, True), (moves, d)
    assert play(["hello"], max_steps=1)[0].diagnose(["hello"]).repeats("still nothing")


def test_diagnose_says_nothing_for_a_success_or_slippery_ice():
    moves = shortest_path(MAP)
    env, result = play(moves)
    assert result.info["success"] == 1.0 and env.diagnose(moves) is None
    slippery, _ = play(["right"], is_slippery=True, max_steps=1)
    assert slippery.diagnose(["right"]) is None

"""GymnasiumEnv on CliffWalking and Taxi: the adapter is generic, not FrozenLake-shaped."""

import pytest

from trivium.envs.base import make_env
from trivium.envs.gym_adapter import GymnasiumEnv, task_seed
from trivium.types import Task

# CliffWalking-v1: a 4x12 grid, state = row * 12 + col, start (3, 0), goal (3, 11), every step -1;
# actions 0 up, 1 right, 2 down, 3 left.
COLS, START, GOAL = 12, 3 * 12 + 0, 3 * 12 + 11
UP, RIGHT, DOWN = "0", "1", "2"


def task(task_id="cliff:0", **data):
    return Task(task_id=task_id, data=data, workflow="multi_turn", reward_fn="")


class CliffText(GymnasiumEnv):
    """Row/column text and named moves, to show the glue a subclass supplies."""

    MOVES = ("up", "right", "down", "left")

    def __init__(self, **kwargs):
        super().__init__("CliffWalking-v1", action_help="Use up, right, down or left.", **kwargs)

    def describe(self, observation, info):
        return f"row {observation // COLS} col {observation % COLS}"

    def parse_action(self, text):
        words = [w for w in text.lower().split() if w in self.MOVES]
        return self.MOVES.index(words[-1]) if words else None

    def is_success(self, reward, terminated, info):
        return terminated  # the goal is the only terminal state; its reward is -1


def test_default_glue_plays_cliffwalking_to_the_goal():
    env = GymnasiumEnv("CliffWalking-v1", max_steps=20, is_success=lambda r, term, info: term)
    assert env.reset(task()) == f"Observation: {START}"
    path = [UP] + [RIGHT] * (COLS - 1) + [DOWN]
    results = [env.step(f"I choose {a}") for a in path]
    assert [r.done for r in results] == [False] * (len(path) - 1) + [True]
    assert results[-2].observation == f"Observation: {GOAL - COLS}"
    assert results[-1].info == {
        "steps": float(len(path)),
        "invalid_actions": 0.0,
        "return": -float(len(path)),  # -1 per step, no cliff
        "success": 1.0,
    }
    env.close()
    assert env.env is None


def test_default_parser_takes_last_integer_in_range_and_explains_invalid_turns():
    env = GymnasiumEnv("CliffWalking-v1")
    env.reset(task())
    assert env.parse_action("not 7 but 1") == 1 and env.parse_action("9") is None
    result = env.step("no idea")
    assert (
        result.observation
        == f"Invalid action. Answer with an action number from 0 to 3.\nObservation: {START}"
    )
    assert result.info["invalid_actions"] == 1.0


def test_subclass_glue_and_instruction():
    env = CliffText(instruction="Reach the goal.", max_steps=2)
    assert env.reset(task()) == "Reach the goal.\n\nrow 3 col 0"
    assert env.step("go up").observation == "row 2 col 0"
    result = env.step("maybe sideways")
    assert "Use up, right, down or left." in result.observation
    assert result.done and result.info["success"] == 0.0  # max_steps=2 ends it


def test_taxi_by_dotted_path_seeds_from_the_task():
    def start(t):
        env = make_env("trivium.envs.gym_adapter:GymnasiumEnv", env_id="Taxi-v4")
        try:
            return env.reset(t)
        finally:
            env.close()

    assert start(task("taxi:1")) == start(task("taxi:1"))
    starts = {start(task("taxi:1", seed=s)) for s in range(8)}
    assert len(starts) > 1  # the seed field drives the start state


def test_task_seed():
    assert task_seed(task(seed=5)) == 5
    assert task_seed(task("a")) == task_seed(task("a")) != task_seed(task("b"))
    with pytest.raises(TypeError, match="field 'seed' must be an integer"):
        task_seed(task(seed="5"))


def test_bad_arguments_and_order():
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1"):
        GymnasiumEnv("CliffWalking-v1", max_steps=0)
    with pytest.raises(RuntimeError, match="before reset"):
        GymnasiumEnv("CliffWalking-v1").step("1")

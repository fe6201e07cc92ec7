"""Learn-to-Ask's world (tasks/ask.py): problems, the simulated user, the expert's logs, the samples made from
them and the reward that grades a turn by what the log says was missing there."""

import json
import random

import pytest

from trivium.envs.ask_user import AskUserEnv
from trivium.rewards.ask import ask_reward
from trivium.tasks.ask import (
    KNOWN,
    NEITHER,
    Problem,
    expert_dialogue,
    learn_to_ask_samples,
    parse_turn,
    write_ask,
)
from trivium.types import Task

P = Problem("Leo", "apples", 8, 3, 3, "start")  # VERBS[3]: "wins {n} more {item}"


def task(problem):
    return Task(task_id="ask:0", data=problem.row(), workflow="multi_turn", reward_fn="")


def test_a_problem_hides_its_missing_number_and_parses_both_questions_and_an_answer():
    assert P.question() == "Leo has some apples. Leo wins 3 more apples. How many apples does Leo have now?"
    assert P.value() == 11 and P.solution() == "8+3=11\n#### 11"
    assert parse_turn("How many apples does Leo have at first?", P) == ("ask", "start")
    assert parse_turn("How many apples does Leo win?", P) == ("ask", "step")
    assert parse_turn("8+3=11\n#### 11", P) == ("answer", 11)
    assert parse_turn("How many pears?", P) == ("other", None) and parse_turn("win", P) == ("other", None)
    step = Problem("Ann", "pens", 12, 7, 4, "step")  # "gives away {n} {item}"
    assert (
        "Ann gives away some pens." in step.question()
        and step.ask("step") == "How many pens does Ann give away?"
    )


def test_the_user_tells_the_missing_number_once_and_scores_the_answer():
    env = AskUserEnv()
    assert env.reset(task(P)) == P.question()
    needless = env.step("How many apples does Leo win?")  # stated in the problem
    assert needless.observation == KNOWN and not needless.done
    told = env.step("How many apples does Leo have at first?")
    assert told.observation == "Leo has 8 apples at first." and not told.done
    assert env.step("How many apples does Leo have at first?").observation == KNOWN  # told already
    assert env.step("I think so.").observation == NEITHER
    end = env.step("8+3=11\n#### 11")
    assert end.done and end.reward == 1.0
    assert end.info == {"success": 1.0, "needed": 1.0, "asked_right": 1.0, "asked_first": 0.0, "needless": 2.0,
                        "questions": 3.0}  # fmt: skip
    guess = AskUserEnv()
    guess.reset(task(P))
    wrong = guess.step("10+3=13\n#### 13")
    assert wrong.done and wrong.reward == 0.0 and wrong.info["asked_right"] == 0.0


def test_the_experts_logs_mix_asking_and_guessing_and_the_samples_say_what_was_missing_at_each_turn():
    rng = random.Random(0)
    dialogues = [expert_dialogue(P, rng) for _ in range(200)]
    first = [d[1]["content"] for d in dialogues]
    asked = sum(parse_turn(t, P) == ("ask", "start") for t in first) / 200
    guessed = sum(parse_turn(t, P)[0] == "answer" for t in first) / 200
    assert 0.3 < asked < 0.5 and 0.4 < guessed < 0.6  # 40% ask at once, 50% guess, 10% ask the other first
    asked_twice = next(d for d in dialogues if len(d) == 6)  # the other number first, then the missing one
    samples = learn_to_ask_samples(P, asked_twice)
    assert [s["missing"] for s in samples] == ["start", "start", None]  # told only after the second question
    assert [len(s["messages"]) for s in samples] == [1, 3, 5]
    assert all(s["messages"][-1]["role"] == "user" for s in samples)
    # the reward grades any response from what the sample says, not from what the expert did
    ask_start, answer = samples[1], samples[2]
    assert ask_reward("How many apples does Leo have at first?", ask_start).reward == 1.0
    assert ask_reward("How many apples does Leo win?", ask_start).metrics == {
        "decision": 1.0,
        "accuracy": 0.0,
    }
    assert ask_reward("8+3=11\n#### 11", ask_start).metrics == {"decision": 0.0, "accuracy": 0.0}  # a guess
    assert ask_reward("8+3=11\n#### 11", answer).reward == 1.0
    assert ask_reward("5+3=8\n#### 8", answer).metrics == {"decision": 1.0, "accuracy": 0.0}
    assert ask_reward("How many apples does Leo have at first?", answer).reward == 0.0  # needless now
    with pytest.raises(ValueError, match="learn_to_ask samples"):
        ask_reward("x", {"missing": "start"})


def test_write_ask_keeps_the_held_out_problems_out_of_every_other_file(tmp_path):
    counts = write_ask(tmp_path, n_train=200, n_test=50, n_logs=300, seed=3)
    assert counts["train.jsonl"] == 200 and counts["test.jsonl"] == 50 and counts["logs.jsonl"] == 300
    rows = {name: [json.loads(x) for x in (tmp_path / name).read_text().splitlines()] for name in counts}
    held_out = {r["question"] for r in rows["test.jsonl"]}
    assert not held_out & {r["question"] for r in rows["train.jsonl"]}
    assert not held_out & {r["messages"][0]["content"] for r in rows["logs.jsonl"]}
    assert {r["missing"] for r in rows["test.jsonl"]} == {None, "start", "step"}
    assert counts["learn_to_ask.jsonl"] == sum(
        m["role"] == "assistant" for r in rows["logs.jsonl"] for m in r["messages"]
    )
    assert write_ask(tmp_path / "again", n_train=200, n_test=50, n_logs=300, seed=3) == counts
    assert (tmp_path / "again" / "logs.jsonl").read_text() == (tmp_path / "logs.jsonl").read_text()

"""The dialogue workflow: a logged conversation as the prompt, every sample scored with the row."""

import pytest
from tests.workflows.test_multi_turn import engine, handle  # noqa: F401 - the module's engine fixture

from trivium.models.chat import render_ids
from trivium.rewards.ask import ask_reward
from trivium.tasks.ask import Problem, expert_dialogue, learn_to_ask_samples
from trivium.types import Task
from trivium.workflows.dialogue import DialogueWorkflow

P = Problem("Leo", "apples", 8, 3, 3, "start")


def sample_row():
    import random

    dialogue = next(d for d in (expert_dialogue(P, random.Random(s)) for s in range(50)) if len(d) == 4)
    return learn_to_ask_samples(P, dialogue)[1]  # after the missing number was asked for and told


def test_the_logged_messages_are_the_prompt_and_each_sample_gets_the_rows_reward(engine):  # noqa: F811
    rec, h = handle(engine, n=3)
    row = sample_row()
    task = Task(task_id="l2a:1", data=row, workflow="dialogue", reward_fn="ask", repeat_times=3)
    exps = DialogueWorkflow().run(task, h)
    assert len(exps) == 3 and len(rec.calls) == 1
    prompt = render_ids(engine.tokenizer, row["messages"], True)
    for run, (e, gen) in enumerate(zip(exps, rec.calls[0][1][0])):
        assert e.run_index == run and e.tokens[: e.prompt_length].tolist() == prompt
        assert e.tokens[e.prompt_length :].tolist() == list(gen.response_ids)
        assert e.reward == ask_reward(gen.text, row).reward and "decision" in e.metrics


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "end with a user message"),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "end with a user"),
        ([{"role": "robot", "content": "Hi"}], r"messages\[0\] must be"),
        ([{"role": "user", "content": 3}], r"messages\[0\] must be"),
    ],
)
def test_a_bad_row_names_the_task_and_the_message(messages, match):
    task = Task(task_id="l2a:7", data={"messages": messages}, workflow="dialogue", reward_fn="ask")
    with pytest.raises(ValueError, match=match) as err:
        DialogueWorkflow().messages(task)
    assert "l2a:7" in str(err.value)

"""Studio over a run's SQL buffer: a real serve process (`trivium run --set mode=serve`) under Studio's root
records calls as pending experiences; Studio lists them with the prompt and every choice, shows the buffer's
experiences token by token, and sends rewards through the serve mode's feedback path (its checks and
answers), which makes them trainable, exactly as POST /feedback does."""

import json

import openai
import pytest
from tests.studio.conftest import QUESTION, serving_run

from trivium.buffer.storage_sql import SqlStorage


@pytest.mark.integration
def test_serve_calls_are_annotated_through_the_feedback_path(studio, tiny_model_dir, tmp_path):
    with serving_run(studio, tiny_model_dir, tmp_path) as info:
        client = openai.OpenAI(base_url=info["base_url"], api_key="EMPTY", max_retries=0)
        one, two = (client.chat.completions.create(model="live", messages=QUESTION, n=n) for n in (1, 2))

        calls = studio.http.get("/api/annotate/calls", params={"id": "serve/live"}).json()
        assert calls["pending"] == 3 and [c["id"] for c in calls["calls"]] == [two.id, one.id]  # newest first
        shown = calls["calls"][0]
        assert "12 apples" in shown["prompt"]
        assert [a["text"] for a in shown["answers"]] == [c.message.content for c in two.choices]

        # the buffer's experiences token by token: rollout log-probs, no trainer numbers, reward pending
        answer = studio.http.get(
            "/api/run/trajectories", params={"id": "serve/live", "source": "buffer"}
        ).json()
        assert answer["total"] == 3 and {r["task_id"] for r in answer["records"]} == {one.id, two.id}
        record = next(r for r in answer["records"] if r["task_id"] == one.id)
        assert "".join(record["response_text"]) == one.choices[0].message.content
        assert record["reward"] is None and record["advantage"] is None and len(record["logprob"]) > 0

        def feedback(**body):
            return studio.http.post("/api/annotate/feedback", json={"id": "serve/live", **body})

        assert feedback(call=one.id, reward=1.0).json()["ready"] == 1
        assert feedback(call=two.id, reward=1.0, choice=1).json()["ready"] == 1
        assert feedback(call=two.id, reward=0.0, choice=0).json()["ready"] == 1
        # the serve mode's answers: a reward is attached once, the range holds, an unknown call is named
        again = feedback(call=one.id, reward=0.5)
        assert again.status_code == 409 and "already has a reward" in again.json()["error"]
        out_of_range = feedback(call=one.id, reward=5.0)
        assert out_of_range.status_code == 400 and "serve.reward_max" in out_of_range.json()["error"]
        unknown = feedback(call="chatcmpl-nope", reward=1.0)
        assert unknown.status_code == 404 and "chatcmpl-nope" in unknown.json()["error"]
        outside = studio.http.get("/api/annotate/calls", params={"id": "../elsewhere"})
        assert outside.status_code == 403

        with SqlStorage(studio.root / "serve" / "live" / "buffer.sqlite") as storage:
            assert (storage.count("pending"), storage.count("ready")) == (0, 3)
            rewarded = {(e.task_id, e.run_index): e for e in storage.peek("ready")}
        assert rewarded[(two.id, 1)].reward == 1.0 and rewarded[(two.id, 0)].reward == 0.0
        assert rewarded[(one.id, 0)].info["feedback"] == {"by": "studio"}
        assert studio.http.get("/api/annotate/calls", params={"id": "serve/live"}).json()["calls"] == []

        # a task set's prompts, sampled through the endpoint (2 answers each), become calls to annotate
        rows = [{"question": f"Ann has {k} pears and eats one. How many pears now?"} for k in (5, 7, 9)]
        (studio.configs / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        sent = studio.http.post(
            "/api/annotate/sample",
            json={"id": "serve/live", "taskset": "prompts.jsonl", "count": 2, "offset": 1},
        ).json()
        assert sent["sent"] == 2 and sent["next_offset"] == 3
        calls = studio.http.get("/api/annotate/calls", params={"id": "serve/live"}).json()["calls"]
        assert [c["id"] for c in calls] == sent["calls"][::-1] and all(len(c["answers"]) == 2 for c in calls)
        assert "9 pears" in calls[0]["prompt"] and "7 pears" in calls[1]["prompt"]
        bad_field = studio.http.post(
            "/api/annotate/sample", json={"id": "serve/live", "taskset": "prompts.jsonl", "field": "prompt"}
        )
        assert bad_field.status_code == 409 and "field 'prompt'" in bad_field.json()["error"]
        outside = studio.http.post("/api/annotate/sample", json={"id": "serve/live", "taskset": "../x.jsonl"})
        assert outside.status_code == 403

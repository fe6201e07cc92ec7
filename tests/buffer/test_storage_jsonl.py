import json

import pytest
import torch

from trivium.buffer.replay import ReplayPolicy
from trivium.buffer.storage import StorageError, experience_to_record
from trivium.buffer.storage_jsonl import JsonlStorage
from trivium.types import Experience


def exps(n, start=0):
    return [
        Experience(
            tokens=torch.tensor([1, 2, 3, 4 + i]),
            prompt_length=2,
            action_mask=torch.tensor([True, False]),
            logprobs=torch.tensor([-0.5, 0.0]),
            task_id=f"t:{start + i}",
            info={"text": f"réponse {start + i} ✓"},
        )
        for i in range(n)
    ]


@pytest.fixture
def path(tmp_path):
    return tmp_path / "run" / "experiences.jsonl"


def task_ids(claim):
    return [e.task_id for e in claim.experiences]


def test_experiences_round_trip_unchanged(path):
    written = [
        *exps(1),
        Experience(
            tokens=torch.arange(6),
            prompt_length=2,
            action_mask=torch.tensor([True, False, True, True]),
            logprobs=torch.tensor([-1.0, 0.0, -2.5, -1e-7], dtype=torch.float64),
            reward=0.3,
            task_id="问题 🙂",
            group_id=7,
            model_version=3,
            is_expert=True,
            info={"nested": {"a": [1, None, "x\x00"]}},
            metrics={"nan": float("nan")},
        ),
    ]
    with JsonlStorage(path) as storage:
        ids = storage.write(written)
    with JsonlStorage(path) as storage:
        claim = storage.read(2, timeout=0)
    assert list(claim.ids) == ids == [0, path.read_bytes().index(b"\n") + 1]  # ids are line offsets
    for got, want in zip(claim.experiences, written):
        assert got.logprobs.dtype == want.logprobs.dtype and torch.equal(got.logprobs, want.logprobs)
        got_record, want_record = experience_to_record(got), experience_to_record(want)
        assert got_record["tensors"] == want_record["tensors"]
        assert json.dumps(got_record["fields"]) == json.dumps(want_record["fields"])  # NaN-safe equality


def test_the_cursor_survives_a_restart_and_only_commits_move_it(path):
    with JsonlStorage(path) as storage:
        storage.write(exps(6))
        storage.commit(storage.read(2, timeout=0))
        storage.read(2, timeout=0)  # read, never committed: the process dies before its checkpoint
        assert (storage.count("consumed"), storage.count("claimed"), storage.count("ready")) == (2, 2, 2)
    with JsonlStorage(path) as storage:
        claim = storage.read(2, timeout=0)
        assert task_ids(claim) == ["t:2", "t:3"]
        assert storage.recover("trainer") == 2
        assert storage.read(2, timeout=0).ids == claim.ids
    with JsonlStorage(path) as storage:  # resume recipe: commit the checkpoint's token, then recover
        storage.commit(claim.token)
        storage.commit(claim.token)  # idempotent
        storage.recover("trainer")
        assert task_ids(storage.read(2, timeout=0)) == ["t:4", "t:5"]
        with pytest.raises(TimeoutError, match="0 complete experiences"):
            storage.read(1, timeout=0.05)


def test_claims_are_committed_in_read_order(path):
    with JsonlStorage(path) as storage:
        storage.write(exps(4))
        first, second = storage.read(2, timeout=0), storage.read(2, timeout=0)
        with pytest.raises(StorageError, match="commit claims in the order"):
            storage.commit(second)
        storage.commit(first)
        storage.commit(second)
        assert storage.count("consumed") == 4


def test_a_torn_write_is_never_read_and_is_overwritten(path):
    with JsonlStorage(path) as storage:
        storage.write(exps(2))
    good = path.read_bytes()
    torn_batch = JsonlStorage(path.with_name("other.jsonl"))
    torn_batch.write(exps(2, start=10))  # borrow the lines of a two-line write...
    first_line = path.with_name("other.jsonl").read_bytes().split(b"\n")[0] + b"\n"
    with open(path, "ab") as f:  # ...and crash after its first line and half of the second
        f.write(first_line + first_line[:40])

    reader = JsonlStorage(path)
    assert task_ids(reader.read(2, timeout=0)) == ["t:0", "t:1"]
    with pytest.raises(TimeoutError):
        reader.read(1, timeout=0)  # the complete first line of the torn write is not taken either

    writer = JsonlStorage(path)  # a restarted writer
    [new_id] = writer.write(exps(1, start=2))
    assert new_id == len(good) and path.read_bytes().startswith(good)
    assert task_ids(reader.read(1, timeout=0)) == ["t:2"]
    reader.close()


def test_a_write_key_stores_a_batch_once_even_across_writers(path):
    ids = JsonlStorage(path).write(exps(2), key="explore:3")
    assert JsonlStorage(path).write(exps(2, start=5), key="explore:3") == ids
    with JsonlStorage(path) as storage:
        assert storage.count() == 2


def test_limits_are_explained(path):
    with JsonlStorage(path) as storage:
        storage.write(exps(1))
        with pytest.raises(StorageError, match=r"FIFO only.*SqlStorage"):
            storage.read(1, policy=ReplayPolicy(), timeout=0)
        storage.read(1, timeout=0)
        with pytest.raises(
            StorageError, match=r"another reader \(process or JsonlStorage\) reads it as consumer 'trainer'"
        ):
            JsonlStorage(path).read(1, timeout=0)
    with open(path, "ab") as f:
        f.write(b'{"not": "an experience"}\n')
    offset = path.stat().st_size - len(b'{"not": "an experience"}\n')
    with pytest.raises(StorageError, match=f"line at byte {offset} is damaged.*truncate -s {offset}"):
        JsonlStorage(path).read(2, timeout=0)

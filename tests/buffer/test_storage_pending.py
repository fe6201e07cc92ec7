"""Delayed rewards: pending experiences are never read until ``attach_reward`` makes them ready.

Run against a SQLite file and a real PostgreSQL server (integration), like ``test_storage_sql.py``.
"""

import math
import random
import sqlite3
import threading

import pytest
import torch

from trivium.buffer.storage import RewardConflict, StorageError, UnknownExperience
from trivium.buffer.storage_jsonl import JsonlStorage
from trivium.buffer.storage_sql import SqlStorage
from trivium.types import Experience


def served(call_id, n_choices=1, version=0):
    """The experiences of one served call: one per choice, reward unknown (NaN) until feedback."""
    return [
        Experience(
            tokens=torch.tensor([5, 6, 7, 8 + k]),
            prompt_length=2,
            action_mask=torch.tensor([True, True]),
            logprobs=torch.tensor([-0.25, -1.5]),
            reward=math.nan,
            task_id=call_id,
            run_index=k,
            model_version=version,
            info={"session_id": "default", "call_ids": [call_id], "choice": k},
        )
        for k in range(n_choices)
    ]


def test_pending_experiences_are_read_only_once_rewarded(open_storage):
    storage = open_storage()
    first = storage.write(served("call-a", 2), key="serve:call-a", pending=True)
    second = storage.write(served("call-b"), key="serve:call-b", pending=True)
    assert storage.write(served("call-a", 2), key="serve:call-a", pending=True) == first  # a retried write
    assert (storage.count("pending"), storage.count("ready"), storage.count()) == (3, 0, 3)
    with pytest.raises(TimeoutError, match=r"0 eligible .*3 pending.*POST /feedback"):
        storage.read(1, timeout=0)

    assert open_storage().attach_reward("call-b", 0.75, info={"user": "u1", "stars": 4}) == second
    assert (storage.count("pending"), storage.count("ready")) == (2, 1)
    claim = storage.read(1, timeout=0)
    [got] = claim.experiences
    assert list(claim.ids) == second and got.reward == 0.75 and got.task_id == "call-b"
    assert got.info["feedback"] == {"user": "u1", "stars": 4} and got.info["choice"] == 0
    assert isinstance(got.info["rewarded_at"], float)
    storage.commit(claim)
    with pytest.raises(TimeoutError):  # call-a is still pending
        storage.read(1, timeout=0)
    assert (storage.count("pending"), storage.count("consumed")) == (2, 1)


def test_a_choice_is_rewarded_on_its_own_and_unknown_ids_are_refused(open_storage):
    storage = open_storage()
    ids = storage.write(served("call-n", 3), pending=True)
    assert storage.attach_reward("call-n", -1.0, run_index=1) == [ids[1]]
    with pytest.raises(
        UnknownExperience, match=r"no experience with run index \(choice\) 7; it has \[0, 1, 2\]"
    ):
        storage.attach_reward("call-n", 1.0, run_index=7)
    with pytest.raises(UnknownExperience, match="holds no experience of task 'nope'") as error:
        storage.attach_reward("nope", 1.0)
    assert isinstance(error.value, LookupError)
    # all choices, but choice 1 already has its reward: refused as a whole, choices 0 and 2 stay pending
    with pytest.raises(RewardConflict, match=rf"id {ids[1]} .*run index 1\) already has the reward -1.0"):
        storage.attach_reward("call-n", 1.0)
    assert (storage.count("pending"), storage.count("ready")) == (2, 1)
    assert storage.attach_reward("call-n", 0.5, run_index=0) == [ids[0]]
    claim = storage.read(2, timeout=0)
    assert list(claim.ids) == ids[:2]  # FIFO by id: rewarded late, served in write order
    assert [e.reward for e in claim.experiences] == [0.5, -1.0]


def test_a_second_reward_conflicts_even_after_training(open_storage):
    storage = open_storage()
    storage.write(served("call-x"), pending=True)
    storage.attach_reward("call-x", 1.0)
    claim = storage.read(1, timeout=0)
    storage.commit(claim)
    with pytest.raises(RewardConflict, match=r"status consumed.*attached once.*nothing was changed"):
        storage.attach_reward("call-x", 0.0)
    storage.write(served("explored"))  # written ready, with its reward
    with pytest.raises(RewardConflict, match="written with its reward"):
        storage.attach_reward("explored", 1.0)


def test_bad_rewards_and_info_are_refused_before_anything_changes(open_storage):
    storage = open_storage()
    storage.write(served("call-q"), pending=True)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number"):
            storage.attach_reward("call-q", bad)
    with pytest.raises(StorageError, match=r"feedback info\['tags'\] holds a set"):
        storage.attach_reward("call-q", 1.0, info={"tags": {"a"}})
    assert storage.count("pending") == 1


def test_a_recovered_claim_of_rewarded_rows_is_ready_again_not_pending(open_storage):
    storage = open_storage()
    ids = storage.write(served("call-r", 2), pending=True)
    storage.attach_reward("call-r", 1.0)
    storage.read(2, timeout=0)  # the trainer dies before its checkpoint
    assert open_storage().recover("trainer") == 2
    again = storage.read(2, timeout=0)
    assert list(again.ids) == ids and all(e.reward == 1.0 for e in again.experiences)


def test_rewards_attached_while_a_trainer_reads_reach_it_exactly_once(open_storage):
    """Rewards from two threads in random order while a reader claims batches of 3: every experience is
    read once, with the reward attached to it (reward of call k: k / 10)."""
    calls = [f"call-{k}" for k in range(24)]
    writer = open_storage()
    for c in calls:
        writer.write(served(c), key=f"serve:{c}", pending=True)
    order = random.Random(0).sample(calls, len(calls))
    got, errors = [], []

    def reward(part):
        storage = open_storage()
        try:
            for c in part:
                storage.attach_reward(c, int(c.split("-")[1]) / 10)
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=reward, args=(order[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    reader = open_storage()
    while len(got) < len(calls):
        claim = reader.read(3, timeout=30)
        got += [(e.task_id, e.reward) for e in claim.experiences]
        reader.commit(claim)
    for t in threads:
        t.join()
    assert not errors
    assert sorted(got) == sorted((c, int(c.split("-")[1]) / 10) for c in calls)
    assert (reader.count("consumed"), reader.count("pending")) == (24, 0)


def test_two_rewards_racing_for_one_call_one_wins(open_storage):
    open_storage().write(served("call-race"), pending=True)
    results = []
    barrier = threading.Barrier(2)

    def attach(value):
        storage = open_storage()
        barrier.wait()
        try:
            storage.attach_reward("call-race", value)
            results.append(("ok", value))
        except RewardConflict:
            results.append(("conflict", value))

    threads = [threading.Thread(target=attach, args=(v,)) for v in (1.0, -1.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(kind for kind, _ in results) == ["conflict", "ok"]
    [winner] = [v for kind, v in results if kind == "ok"]
    assert open_storage().read(1, timeout=0).experiences[0].reward == winner


def test_a_database_from_before_the_task_id_index_gets_it_and_stays_readable(tmp_path):
    path = tmp_path / "old.db"
    with SqlStorage(path) as storage:
        ids = storage.write(served("old-call"))
    with sqlite3.connect(path) as conn:  # what an older trivium created: no index on task_id
        conn.execute("DROP INDEX experiences_task_id")
    with SqlStorage(path) as storage:
        assert list(storage.read(1, timeout=0).ids) == ids
        storage.write(served("new-call"), pending=True)
        storage.attach_reward("new-call", 1.0)
    with sqlite3.connect(path) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "experiences_task_id" in names


def test_jsonl_storage_refuses_delayed_rewards_naming_the_sql_storage(tmp_path):
    storage = JsonlStorage(tmp_path / "buffer.jsonl")
    with pytest.raises(NotImplementedError, match=r"write\(pending=True\).*use SqlStorage"):
        storage.write(served("c"), pending=True)
    with pytest.raises(NotImplementedError, match=r"attach_reward.*use SqlStorage"):
        storage.attach_reward("c", 1.0)
    storage.write(served("c"))
    assert (storage.count("pending"), storage.count("ready")) == (0, 1)
    storage.close()

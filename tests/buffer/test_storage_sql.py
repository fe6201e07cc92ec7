"""SqlStorage contract tests, run against a SQLite file and a real PostgreSQL server (integration)."""

import os
import random
import signal
import subprocess
import sys

import pytest
import torch

from trivium.buffer.replay import ReplayPolicy, rank
from trivium.buffer.storage import StorageError, experience_to_record
from trivium.buffer.storage_sql import SqlStorage
from trivium.types import Experience


def exps(n, start=0, version=0):
    return [
        Experience(
            tokens=torch.tensor([1, 2, 3, 4 + i]),
            prompt_length=2,
            action_mask=torch.tensor([True, False]),
            logprobs=torch.tensor([-0.5, 0.0]),
            task_id=f"t:{start + i}",
            model_version=version,
        )
        for i in range(n)
    ]


def test_experiences_round_trip_unchanged(open_storage):
    storage = open_storage()
    written = [
        *exps(2),
        Experience(
            tokens=torch.arange(7),
            prompt_length=3,
            action_mask=torch.tensor([True, False, True, True]),
            logprobs=torch.tensor([-1.25, 0.0, -3e-8, -7.5], dtype=torch.float64),
            reward=0.1,
            task_id="问题 №1 🙂",
            group_id=-3,
            run_index=2,
            model_version=9,
            explore_step=4,
            is_expert=True,
            info={"text": 'naïve\n"x"\x00', "turns": [1, {"ok": None}]},
            metrics={"len": 4.0, "inf": float("inf")},
        ),
    ]
    ids = storage.write(written)
    claim = open_storage().read(3, timeout=0)
    assert list(claim.ids) == ids == sorted(ids)
    for got, want in zip(claim.experiences, written):
        assert got.tokens.dtype == want.tokens.dtype and torch.equal(got.tokens, want.tokens)
        assert got.logprobs.dtype == want.logprobs.dtype and torch.equal(got.logprobs, want.logprobs)
        assert experience_to_record(got) == experience_to_record(want)  # every field, bit for bit


def test_fifo_serves_each_experience_once_in_write_order(open_storage):
    storage = open_storage()
    ids = storage.write(exps(3)) + storage.write(exps(3, start=3))
    first = storage.read(4, timeout=0)
    storage.commit(first)
    second = storage.read(2, consumer="other", timeout=0)
    assert list(first.ids + second.ids) == ids
    assert [e.task_id for e in first.experiences + second.experiences] == [f"t:{i}" for i in range(6)]
    assert (storage.count("consumed"), storage.count("claimed"), storage.count("ready")) == (4, 2, 0)
    with pytest.raises(TimeoutError, match=r"0 eligible .*4 consumed.*explorer") as error:
        storage.read(1, timeout=0.05)
    assert where_of(storage) in str(error.value)
    assert storage.count("claimed") == 2  # a read that timed out claims nothing


def where_of(storage):
    return storage.url.render_as_string(hide_password=True)


def test_a_write_key_stores_a_batch_once(open_storage):
    ids = open_storage().write(exps(3), key="explore:17")
    again = open_storage().write(exps(3, start=10), key="explore:17")  # a producer re-running step 17
    assert again == ids
    assert open_storage().count() == 3


def test_uncommitted_claims_come_back_after_recover_and_committed_ones_never(open_storage):
    storage = open_storage()
    ids = storage.write(exps(6))
    trained = storage.read(2, timeout=0)
    storage.commit(trained)
    lost = storage.read(2, timeout=0)  # the reader dies here, before its checkpoint
    storage.close()

    restarted = open_storage()
    assert restarted.count("claimed") == 2  # still held: no other reader gets them
    assert list(restarted.read(2, consumer="other", timeout=0).ids) == ids[4:]
    assert restarted.recover("trainer") == 2
    again = restarted.read(2, timeout=0)
    assert again.ids == lost.ids and again.token != lost.token
    restarted.commit(again)
    restarted.commit(again)  # idempotent
    assert restarted.count("consumed") == 4
    with pytest.raises(StorageError, match="handed back by recover"):
        restarted.commit(lost.token)
    with pytest.raises(StorageError, match="no claim 'nope'"):
        restarted.commit("nope")


def test_resume_commits_the_checkpointed_claim_and_releases_the_rest(open_storage):
    storage = open_storage()
    ids = storage.write(exps(4))
    in_checkpoint = storage.read(2, timeout=0)  # trained, checkpoint written, killed before commit
    after_checkpoint = storage.read(2, timeout=0)  # trained, but no checkpoint holds it
    storage.close()

    restarted = open_storage()
    restarted.commit(in_checkpoint.token)  # the recipe: commit what the checkpoint holds, then recover
    assert restarted.recover("trainer") == 2
    assert list(restarted.read(2, timeout=0).ids) == ids[2:] == list(after_checkpoint.ids)
    with pytest.raises(TimeoutError):
        restarted.read(1, timeout=0)


def test_replay_serves_what_the_reference_ranks(open_storage):
    rng = random.Random(0)
    storage = open_storage()
    state = {}  # id -> [model_version, use_count, last_use_step]
    for v in [rng.randrange(4) for _ in range(10)]:
        state[storage.write(exps(1, version=v))[0]] = [v, 0, None]
    policy = ReplayPolicy(version_weight=1.0, use_weight=1.5, cooldown_steps=1, max_uses=3)
    skipped = 0
    for step in range(14):
        expected = rank(policy, [(i, *s) for i, s in state.items()], step, 3)
        if len(expected) < 3:
            with pytest.raises(TimeoutError):
                storage.read(3, policy=policy, step=step, timeout=0)
            skipped += 1
            continue
        claim = storage.read(3, policy=policy, step=step, timeout=0)
        assert list(claim.ids) == expected, step
        storage.commit(claim)
        for i in expected:
            state[i][1:] = [state[i][1] + 1, step]
    assert skipped > 0  # the run reached the point where max_uses and cooldown hold rows back
    assert storage.count("consumed") == sum(s[1] == 3 for s in state.values()) > 0


def test_replay_cooldown_and_max_uses(open_storage):
    storage = open_storage()
    [old], [new] = storage.write(exps(1, version=1)), storage.write(exps(1, version=2))
    policy = ReplayPolicy(version_weight=1.0, use_weight=0.0, cooldown_steps=1, max_uses=2)
    served = []
    for _ in range(4):  # no step given: the storage counts this consumer's reads, 0, 1, 2, 3
        claim = storage.read(1, policy=policy, timeout=0)
        served.append((claim.step, claim.ids[0]))
        storage.commit(claim)
    # step 0 the newer; 1 the older (new cools down); 2 new again; 3 old again; then both retired
    assert served == [(0, new), (1, old), (2, new), (3, old)]
    with pytest.raises(TimeoutError, match="0 eligible"):
        storage.read(1, policy=policy, timeout=0)
    assert storage.count("consumed") == 2


def test_a_used_claim_is_served_again_before_any_commit_and_recover_undoes_it(open_storage):
    """Uses count when the trainer has trained (``use``), not when a checkpoint commits: a replay policy
    serves the rows again within a run at any checkpoint interval. A restart undoes the uses no
    checkpoint holds, so the resumed run sees the counts its model was trained with."""
    storage = open_storage()
    ids = storage.write(exps(2, version=1))
    policy = ReplayPolicy(version_weight=0.0, use_weight=-1.0, cooldown_steps=0, max_uses=2)
    first = storage.read(1, policy=policy, step=1, timeout=0)
    storage.use(first)
    storage.use(first)  # idempotent
    with pytest.raises(TimeoutError):  # used at step 1: not again at step 1 (cooldown 0: from step 2)
        storage.read(2, policy=policy, step=1, timeout=0)
    second = storage.read(1, policy=policy, step=2, timeout=0)
    assert second.ids == first.ids  # a negative use weight prefers the used row: served again, uncommitted
    storage.use(second)
    assert storage.count("consumed") == 1  # max_uses 2 reached, still before any commit
    third = storage.read(1, policy=policy, step=3, timeout=0)
    assert third.ids == (ids[1],)
    storage.use(third)
    storage.commit(first)  # the checkpoint after step 1; steps 2 and 3 were trained, then the run died
    storage.close()

    restarted = open_storage()
    restarted.commit(first.token)
    assert restarted.recover("trainer") == 2  # the uses of steps 2 and 3 undone
    assert (restarted.count("consumed"), restarted.count("ready")) == (0, 2)
    again = restarted.read(1, policy=policy, step=2, timeout=0)
    assert again.ids == first.ids  # as at step 2 the first time: one use, at step 1
    restarted.commit(again)  # commit counts a use that was never counted by use()
    assert restarted.count("consumed") == 1
    with pytest.raises(StorageError, match="handed back by recover"):
        restarted.use(second.token)
    with pytest.raises(StorageError, match="handed back by recover"):
        restarted.commit(third.token)


CONSUMER = r"""
import json, sys, time
from trivium.buffer.storage_sql import SqlStorage

url, table, consumer, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
storage = SqlStorage(url, table=table)
print("ready", flush=True)
got, deadline = [], time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        claim = storage.read(4, consumer=consumer, timeout=0.2)
    except TimeoutError:
        if storage.count("consumed") == total:
            break
        continue
    got += [[i, e.task_id] for i, e in zip(claim.ids, claim.experiences)]
    storage.commit(claim)
print(json.dumps(got), flush=True)
"""


def spawn(code, *args):
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_two_reader_processes_race_and_each_experience_goes_to_one(open_storage, where):
    import json

    storage, total = open_storage(), 96
    readers = [spawn(CONSUMER, *where, name, total) for name in ("a", "b")]
    for reader in readers:
        assert reader.stdout.readline() == "ready\n", reader.stderr.read()
    ids = []
    for batch in range(total // 4):  # written while both readers claim
        ids += storage.write(exps(4, start=4 * batch))
    got = []
    for reader in readers:
        out, err = reader.communicate(timeout=90)
        assert reader.returncode == 0, err
        got += json.loads(out.splitlines()[-1])
    assert sorted(i for i, _ in got) == ids  # none lost, none twice
    assert {i: t for i, t in got} == {i: f"t:{k}" for k, i in enumerate(ids)}


DOOMED = r"""
import sys, time
from trivium.buffer.storage_sql import SqlStorage

claim = SqlStorage(sys.argv[1], table=sys.argv[2]).read(4, consumer="doomed", timeout=30)
print(claim.token, flush=True)
time.sleep(120)
"""


def test_a_sigkilled_reader_loses_nothing(open_storage, where):
    storage = open_storage()
    ids = storage.write(exps(8))
    doomed = spawn(DOOMED, *where)
    token = doomed.stdout.readline().strip()
    assert token, doomed.stderr.read()
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=30)

    assert storage.count("claimed") == 4
    assert list(storage.read(4, timeout=0).ids) == ids[4:]  # the claimed rows stay held until recovered
    assert storage.recover("doomed") == 4
    assert list(storage.read(4, timeout=0).ids) == ids[:4]
    with pytest.raises(StorageError, match="handed back"):
        storage.commit(token)


def test_unreachable_postgres_names_the_url_and_hides_the_password():
    with pytest.raises(StorageError) as error:
        SqlStorage("postgresql+psycopg2://alice:s3cret@127.0.0.1:1/runs")
    message = str(error.value)
    assert "s3cret" not in message
    assert "postgresql+psycopg2://alice:***@127.0.0.1:1/runs" in message
    assert "server is running" in message


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("sqlite://", "in-memory"),
        ("postgres://bob:pw@host/db", "write postgresql://, not postgres://"),
        ("mysql://bob:pw@host/db", "'mysql' is not supported"),
        ("postgresql://bob:pw@host:port/db", "not a database URL"),
    ],
)
def test_bad_urls_are_explained(url, match):
    with pytest.raises(StorageError, match=match) as error:
        SqlStorage(url)
    assert ":pw@" not in str(error.value)


def test_a_sqlite_path_that_cannot_be_created_is_explained(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError, match=r"file/run/buffer.db: cannot create its folder"):
        SqlStorage(tmp_path / "file" / "run" / "buffer.db")


def _open_at(path, start, results):
    """Open ``path`` through the storage's engine at ``start`` (the URL and the engine made before, so
    that the processes' first connections meet) and create a table there."""
    import time

    from trivium.buffer.sql_engine import create_engine, parse_url

    url = parse_url(path)
    engine = create_engine(url, str(path))
    while time.time() < start:
        pass
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS opened (pid INTEGER)")
            conn.exec_driver_sql(f"INSERT INTO opened VALUES ({os.getpid()})")
        results.put("ok")
    except Exception as error:  # reported to the test, which names it
        results.put(f"{type(error).__name__}: {error}")


def test_processes_opening_a_new_sqlite_file_at_once_all_open_it(tmp_path):
    """An explore and a train process started together open a buffer file that does not exist yet: switching
    it to the write-ahead log takes a lock SQLite does not wait for, and one of them failed at once with
    "database is locked" (4 processes at once: 6 trials in 20 before the switch was retried)."""
    import multiprocessing
    import sqlite3
    import time

    fork = multiprocessing.get_context("fork")
    for trial in range(12):
        path = tmp_path / f"buffer{trial}.sqlite"
        results = fork.Queue()
        start = time.time() + 0.15  # the forks are up in ~50 ms
        procs = [fork.Process(target=_open_at, args=(path, start, results)) for _ in range(4)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert outcomes == ["ok"] * 4, (trial, outcomes)
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM opened").fetchone() == (4,)
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)

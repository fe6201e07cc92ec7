"""The batching wrapper: one engine call per fired batch, results to the right caller, no deadlocks.

Threads are joined with a timeout, so a deadlock fails the test instead of hanging it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import Generation, RolloutModel, SamplingParams
from trivium.models.transformers_engine import TransformersEngine

PARAMS = SamplingParams(n=2, max_tokens=4)


class EchoEngine:
    """Answers prompt p with response (p[0], sample index); records every call's prompts."""

    tokenizer = None
    version = 0

    def __init__(self, fail: bool = False):
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []
        self.fail = fail

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Generation]]:
        self.calls.append(([list(p) for p in prompts], params))
        if self.fail:
            raise RuntimeError("engine exploded")
        return [
            [Generation(tuple(p), (p[0], j), (0.0, 0.0), "length", f"{p[0]}:{j}") for j in range(params.n)]
            for p in prompts
        ]

    def update_weights(self, state_dict, version):  # pragma: no cover - not used here
        self.version = version

    def state_dict(self):  # pragma: no cover - not used here
        return {}


def run_threads(count: int, target: Callable[[int], object], timeout: float = 10.0) -> list[object]:
    """Run ``target(i)`` in ``count`` threads; return results (or raised exceptions) by index."""
    results: list[object] = [None] * count

    def body(i: int) -> None:
        try:
            results[i] = target(i)
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "deadlock: threads still waiting"
    return results


def test_eight_workers_one_engine_call_results_to_right_caller() -> None:
    engine = EchoEngine()
    batching = BatchingRolloutModel(engine)
    entered = threading.Barrier(8)

    def work(i: int) -> list[Generation]:
        with batching.worker():
            entered.wait()  # every worker is registered before anyone generates
            time.sleep(random.random() * 0.02)
            return batching.generate([[100 + i]], PARAMS)[0]

    results = run_threads(8, work)
    assert len(engine.calls) == batching.engine_calls == 1
    assert batching.requests == 8
    for i, gens in enumerate(results):
        assert [g.response_ids for g in gens] == [(100 + i, 0), (100 + i, 1)]
        assert all(g.prompt_ids == (100 + i,) for g in gens)


def test_order_key_fixes_order_in_batch() -> None:
    engine = EchoEngine()
    batching = BatchingRolloutModel(engine)

    def work(i: int) -> object:
        with batching.worker():
            time.sleep(random.random() * 0.02)  # arrive in random order
            return batching.generate([[i]], PARAMS, order_key=(7 - i, "x"))

    with batching.expect_workers(8):
        run_threads(8, work)
    assert engine.calls[0][0] == [[7 - k] for k in range(8)]


def test_one_engine_call_per_distinct_params() -> None:
    engine = EchoEngine()
    batching = BatchingRolloutModel(engine)
    other = SamplingParams(n=1, temperature=0.5)

    def work(i: int) -> list[Generation]:
        with batching.worker():
            return batching.generate([[i]], PARAMS if i % 2 else other, order_key=i)[0]

    with batching.expect_workers(6):
        results = run_threads(6, work)
    assert batching.engine_calls == 2
    assert {tuple(map(tuple, prompts)) for prompts, _ in engine.calls} == {
        ((0,), (2,), (4,)),
        ((1,), (3,), (5,)),
    }
    assert [len(r) for r in results] == [1, 2, 1, 2, 1, 2]  # type: ignore[arg-type]


def test_engine_error_reaches_every_caller() -> None:
    batching = BatchingRolloutModel(EchoEngine(fail=True))

    def work(i: int) -> object:
        with batching.worker():
            return batching.generate([[i]], PARAMS)

    with batching.expect_workers(4):
        results = run_threads(4, work)
    assert all(isinstance(r, RuntimeError) and "exploded" in str(r) for r in results)
    assert len({id(r) for r in results}) == 1  # the one engine error, re-raised in each caller
    # the wrapper is still usable afterwards
    batching.engine = EchoEngine()
    with batching.worker():
        assert batching.generate([[1]], PARAMS)[0][0].response_ids == (1, 0)


def test_worker_leaving_without_generate_does_not_block() -> None:
    engine = EchoEngine()
    batching = BatchingRolloutModel(engine)
    entered = threading.Barrier(3)

    def work(i: int) -> object:
        with batching.worker():
            entered.wait()
            if i == 0:
                time.sleep(0.05)  # the others are blocked by now; leaving must release them
                return None
            return batching.generate([[i]], PARAMS)

    results = run_threads(3, work)
    assert results[0] is None and all(r is not None for r in results[1:])
    assert batching.engine_calls == 1


def test_announced_worker_that_never_starts_delays_but_does_not_block(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batching = BatchingRolloutModel(EchoEngine(), late_worker_grace_s=0.3)

    def work(i: int) -> object:
        with batching.worker():
            return batching.generate([[i]], PARAMS)

    start = time.monotonic()
    with batching.expect_workers(3), ThreadPoolExecutor(2) as pool:  # the third announced worker never comes
        futures = [pool.submit(work, i) for i in range(2)]
        time.sleep(0.1)
        assert not any(f.done() for f in futures)  # held back: the third worker could still arrive
        results = [f.result(timeout=5) for f in futures]
    assert 0.3 <= time.monotonic() - start < 5
    assert [r[0][0].prompt_ids for r in results] == [(0,), (1,)]
    assert batching.engine_calls == 1
    assert "did not start" in caplog.text


def test_leaving_expect_workers_releases_unclaimed_slots() -> None:
    batching = BatchingRolloutModel(EchoEngine(), late_worker_grace_s=60)
    results: list[object] = []

    def work() -> None:
        with batching.worker():
            results.append(batching.generate([[1]], PARAMS))

    with batching.expect_workers(2):
        thread = threading.Thread(target=work)
        thread.start()
        time.sleep(0.05)
        assert not results
    thread.join(5)
    assert len(results) == 1


def test_callers_outside_workers_fire_after_max_wait() -> None:
    batching = BatchingRolloutModel(EchoEngine(), max_wait_s=0.02)
    start = time.monotonic()
    assert batching.generate([[3], [4]], PARAMS)[1][0].response_ids == (4, 0)
    assert 0.015 <= time.monotonic() - start < 2.0
    assert batching.generate([], PARAMS) == []


def test_nested_worker_contexts_count_once() -> None:
    engine = EchoEngine()
    batching = BatchingRolloutModel(engine, max_wait_s=60)  # only the worker rule can fire it in time
    with batching.worker(), batching.worker():
        assert batching.generate([[1]], PARAMS)[0][0].prompt_ids == (1,)
    assert batching.engine_calls == 1


def test_bounded_pool_batches_do_not_depend_on_timing() -> None:
    """4 tasks on 2 threads: batches are always {0, 1} then {2, 3}, whatever the thread timing."""

    def run(seed: int) -> list[list[list[int]]]:
        rng = random.Random(seed)
        delays = [rng.random() * 0.02 for _ in range(8)]
        engine = EchoEngine()
        batching = BatchingRolloutModel(engine)

        def task(i: int) -> None:
            with batching.worker():
                time.sleep(delays[i])
                batching.generate([[i]], PARAMS, order_key=i)
                time.sleep(delays[i + 4])

        with batching.expect_workers(4, concurrency=2), ThreadPoolExecutor(2) as pool:
            list(pool.map(task, range(4), timeout=10))
        return [prompts for prompts, _ in engine.calls]

    assert run(0) == run(1) == run(2) == [[[0], [1]], [[2], [3]]]


def test_real_engine_samples_reproducible_regardless_of_timing(
    tiny_dir: Path, prompts: list[list[int]]
) -> None:
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8)

    def run(seed: int) -> list[object]:
        batching = BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_dir, seed=0))
        delays = random.Random(seed).sample(range(8), 8)

        def work(i: int) -> list[Generation]:
            with batching.worker():
                time.sleep(delays[i] * 0.003)
                return batching.generate([prompts[i % len(prompts)]], params, order_key=i)[0]

        with batching.expect_workers(8):
            results = run_threads(8, work)
        assert batching.engine_calls == 1
        return results

    first, second = run(1), run(2)
    assert first == second
    # and equal to one direct engine call with the prompts in key order
    direct = TransformersEngine.from_pretrained(tiny_dir, seed=0).generate(
        [prompts[i % len(prompts)] for i in range(8)], params
    )
    assert first == direct


def test_delegates_rollout_model_interface(tiny_dir: Path) -> None:
    engine = TransformersEngine.from_pretrained(tiny_dir, seed=0)
    batching = BatchingRolloutModel(engine)
    assert isinstance(batching, RolloutModel)
    assert batching.tokenizer is engine.tokenizer
    batching.update_weights(engine.state_dict(), version=5)
    assert batching.version == engine.version == 5
    assert batching.state_dict().keys() == engine.state_dict().keys()


def test_expect_workers_is_exclusive_and_validated() -> None:
    batching = BatchingRolloutModel(EchoEngine())
    outer = batching.expect_workers(1)
    with outer, pytest.raises(RuntimeError, match="already active"), batching.expect_workers(1):
        pass
    with pytest.raises(ValueError, match="concurrency"), batching.expect_workers(2, concurrency=0):
        pass


def test_drive_runs_every_batch_on_the_driving_thread() -> None:
    threads: list[int] = []

    class RecordingEngine(EchoEngine):
        def generate(self, prompts, params):
            threads.append(threading.get_ident())
            return super().generate(prompts, params)

    model = BatchingRolloutModel(RecordingEngine())

    def work(i: int) -> list[Generation]:
        with model.worker():
            first = model.generate([[i]], PARAMS, order_key=i)[0]
            return first + model.generate([[i + 100]], PARAMS, order_key=i)[0]  # two rounds per worker

    with model.expect_workers(6), ThreadPoolExecutor(max_workers=6) as pool, model.driving():
        futures = [pool.submit(work, i) for i in range(6)]
        model.drive(lambda: all(f.done() for f in futures))
    assert [f.result()[0].response_ids[0] for f in futures] == list(range(6))
    assert [f.result()[2].response_ids[0] for f in futures] == [i + 100 for i in range(6)]
    assert model.engine_calls == 2
    assert set(threads) == {threading.get_ident()}  # the driver ran both batches
    with pytest.raises(RuntimeError, match="inside driving"):
        model.drive(lambda: True)
    with model.driving(), pytest.raises(RuntimeError, match="one driver at a time"), model.driving():
        pass

"""Callers waiting in ``BatchingRolloutModel.generate`` sleep until something changes: while a batch runs
they do not wake at their passed deadlines over and over (that spin starved the running batch of the GIL:
the endpoint under load answered small requests after ~60 s instead of ~2 s, benchmarks/endpoint_load.py)."""

from __future__ import annotations

import threading
import time

from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import SamplingParams


class CountingCondition(threading.Condition):
    """Counts the waits of the callers (each return from ``wait`` is a wake-up)."""

    waits = 0

    def wait(self, timeout=None):
        CountingCondition.waits += 1
        return super().wait(timeout)


def test_waiters_do_not_spin_while_a_batch_runs(tiny_dir, prompts):
    from trivium.models.transformers_engine import TransformersEngine

    engine = TransformersEngine.from_pretrained(tiny_dir, seed=0)
    model = BatchingRolloutModel(engine, max_wait_s=0.01)
    model._cv = CountingCondition()
    params = SamplingParams(max_tokens=4)
    results: list = []

    def call(prompt):
        results.append(model.generate([prompt], params))

    with engine._lock:  # the first batch starts and then waits here: a long engine call
        first = threading.Thread(target=call, args=(prompts[0],))
        first.start()
        while not model._busy:
            time.sleep(0.005)
        waiters = [threading.Thread(target=call, args=(p,)) for p in prompts[1:] * 3]
        for t in waiters:
            t.start()
        time.sleep(0.05)  # all waiting, and their max_wait_s passed
        before = CountingCondition.waits
        time.sleep(0.3)
        looks = CountingCondition.waits - before
    for t in [first, *waiters]:
        t.join(timeout=60)
    assert len(results) == 1 + len(waiters)
    assert looks <= len(waiters), f"{looks} wake-ups of {len(waiters)} waiters in 0.3 s: they spin"

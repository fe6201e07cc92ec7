"""The long-tail workload of ``benchmarks/long_tail.py``: the quickstart's word problems behind a remote
environment whose calls take a heavy-tailed time (like a sandbox that boots, or a web page that loads).

Each task first "resets" its environment: a call that sleeps (costing no CPU, like waiting on a remote
service) for a delay drawn per task occurrence: 0.1-0.5 s usually, and with probability ``TAIL_P`` a
Pareto tail, ``2 s x Pareto(1.2)``, capped at ``TAIL_CAP_S``. The draw depends only on the seed, the task id
and how many times this process has run that task, so every mode of the benchmark sees the same delays for
the same task occurrences. Then the question is answered and scored as in the ``math`` workflow.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

from trivium.envs.calls import call_with_timeout
from trivium.workflows.math import MathWorkflow

TAIL_P = 0.08  # share of environment calls in the tail
TAIL_CAP_S = 60.0
_seen: Counter[str] = Counter()
_lock = threading.Lock()


def delay_s(seed: int, task_id: str, occurrence: int) -> float:
    rng = random.Random(f"{seed}:{task_id}:{occurrence}")
    if rng.random() < TAIL_P:
        return min(TAIL_CAP_S, 2.0 * rng.paretovariate(1.2))
    return rng.uniform(0.1, 0.5)


def _wait(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # in slices: a call stopped by its task's limit ends at the next one
        time.sleep(0.02)


class LongTailMath(MathWorkflow):
    """``math`` after an environment reset of heavy-tailed duration (see the module docstring)."""

    def run(self, task, model):
        with _lock:
            occurrence = _seen[task.task_id]
            _seen[task.task_id] += 1
        seconds = delay_s(int(os.environ.get("LONG_TAIL_SEED", "0")), task.task_id, occurrence)
        call_with_timeout(_wait, seconds, timeout_s=None, what="environment reset")
        return super().run(task, model)

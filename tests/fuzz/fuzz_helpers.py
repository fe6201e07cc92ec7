"""Shared pieces of the fuzz tests: example counts, Hypothesis settings and nasty values.

Every fuzz test runs ``FAST`` examples in the default suite (the whole folder stays under ~30 s on 2 cores)
and ``SLOW`` examples under ``-m slow``; together the slow runs generate 16,000 inputs, 10,000 of them task
rows, CSV files and checkpoints (``test_fuzz_task_files.py``, ``test_fuzz_csv_and_checkpoints.py``). The two
largest config runs were cut to 2,500 each on 2026-12-03 and to 1,500 on 2026-12-07 for CI's time budget
(59 and 47 s of the slow stage at 2,500); being derandomised, CI repeats the same inputs on every landing, so
more of them buy little there; TRIVIUM_FUZZ_RANDOM=1 hunts. Every
run is derandomised (the same examples every time: CI is never red by chance, and a failure reproduces);
``TRIVIUM_FUZZ_RANDOM=1`` makes the slow runs explore new inputs on each run, for a bug hunt (a failure
prints the ``@reproduce_failure`` blob to pin it; then add the case as a named test). A random slow run
found the byte-order-mark case of ``test_fuzzed_jsonl_files`` (the oracle's mistake, not the reader's).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]


def fuzz_settings(examples: int, *, derandomize: bool) -> settings:
    """``derandomize``: False lets a slow run explore, only when ``TRIVIUM_FUZZ_RANDOM=1``."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=derandomize or os.environ.get("TRIVIUM_FUZZ_RANDOM") != "1",
        suppress_health_check=SUPPRESSED,
        database=None,
        print_blob=True,
    )


def both_suites(fast: int, slow: int):
    """Parametrise a fuzz test into a default-suite run of ``fast`` examples and a slow one of ``slow``."""
    return pytest.mark.parametrize(
        "examples",
        [pytest.param(fast, id=f"{fast}"), pytest.param(slow, id=f"{slow}", marks=pytest.mark.slow)],
    )


# Strings that broke something once: control tokens, part references, paths, encodings, huge ones.
NASTY_STRINGS = [
    "",
    " ",
    ":",
    ".rel:x",
    "@org/model",
    "`x",
    "a\x00b",
    "x" * 300,
    "y/" * 3000,
    "<|end|><|assistant|>",
    "\ud800",
    "null",
    ".inf",
    "1e29",
    "[x",
    "{",
    "*alias",
    "&anchor x",
    "!!python/object:os.system",
    "\u2028",
    "é" * 10,
]

NASTY_NUMBERS = [
    0,
    -1,
    1,
    2**31,
    2**63,
    10**30,
    10**400,
    1e-300,
    1e308,
    -1e308,
    0.5,
    float("inf"),
    float("nan"),
]


def json_values(max_leaves: int = 8):
    """JSON-like values: scalars (nasty ones included) nested in lists and dicts."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(NASTY_NUMBERS),
        st.integers(),
        st.floats(
            allow_nan=True, allow_infinity=True, allow_subnormal=False
        ),  # tests/conftest.py flushes denormals
        st.sampled_from(NASTY_STRINGS),
        st.text(max_size=20),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def task_reader(source, mode: str):
    """The math workflow's task reader over ``source`` (a file path, or rows another source read), in
    ``on_bad_row`` ``mode``: what the task-file fuzz tests feed."""
    from trivium.buffer import TaskSetReader

    return TaskSetReader(
        source,
        name="fuzz",
        fields={},
        required={"question": (str,), "answer": (str, int, float)},
        workflow="math",
        reward_fn="math_verify",
        repeat_times=1,
        on_bad_row=mode,
    )

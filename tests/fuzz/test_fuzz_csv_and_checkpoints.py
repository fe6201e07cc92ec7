"""Fuzzed CSV task files and damaged checkpoints (issue 26): a CSV file gives tasks or a ``TaskDataError``
naming it, never another exception; a checkpoint folder with fuzzed ``meta.json`` and ``trainer_state.pt``
bytes is resumed from or refused with ``CheckpointDamaged`` naming it, never another exception.

With the JSON Lines and JSON runs of ``test_fuzz_task_files.py`` the slow runs read 10,000 fuzzed rows,
CSV files and checkpoints."""

from __future__ import annotations

import io
import json

import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.fuzz_helpers import both_suites, fuzz_settings, task_reader

from trivium.buffer import TaskDataError
from trivium.buffer.sources import source_rows
from trivium.launch.resume import CheckpointDamaged, find_resume_point


def cells():
    return st.one_of(
        st.text(max_size=12),
        st.sampled_from(["", '"', '""', "a,b", "line\nbreak", "x" * 140_000, "\x00", "señor", "#### 4"]),
    )


def csv_bytes():
    """A CSV file's bytes: a header, rows of fuzzed cells (quoted or not), in one of several encodings,
    sometimes with raw noise."""
    row = st.lists(cells(), min_size=1, max_size=4)
    quoted = st.booleans()

    def render(header, rows, quote, encoding, noise):
        def line(values):
            return ",".join('"' + v.replace('"', '""') + '"' if quote else v for v in values)

        text = "\n".join([line(header), *(line(r) for r in rows)]) + "\n"
        try:
            data = text.encode(encoding)
        except UnicodeEncodeError:
            data = text.encode("utf-8", "surrogatepass")
        return data + noise

    return st.builds(
        render,
        st.sampled_from([["question", "answer"], ["answer", "question", "extra"], ["q"], ["question", ""]]),
        st.lists(row, max_size=6),
        quoted,
        st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1", "cp1252"]),
        st.one_of(st.just(b""), st.binary(max_size=12)),
    )


def read_csv(path, mode):
    return task_reader(source_rows(str(path), field="buffer.taskset.path"), mode)


@both_suites(fast=100, slow=3000)
def test_fuzzed_csv_files(tmp_path, examples):
    @fuzz_settings(examples, derandomize=examples < 1000)
    @given(csv_bytes(), st.sampled_from(["error", "skip"]))
    def run(data, mode):
        path = tmp_path / "fuzz.csv"
        path.write_bytes(data)
        try:
            reader = read_csv(path, mode)
        except TaskDataError as error:
            assert str(path) in str(error) or "task set 'fuzz'" in str(error), str(error)
            return
        assert all(isinstance(t.data["question"], str) and t.data["question"] for t in reader.all_tasks())

    run()


def state_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"resume": {"claims": []}, "rng": {}, "optimizer": {"state": {}}, "step": 2}, buffer)
    return buffer.getvalue()


GOOD_STATE = state_bytes()
GOOD_META = {
    "stage": "main",
    "step": 2,
    "global_step": 2,
    "version": 2,
    "strategy": "single",
    "world_size": 1,
}


def metas():
    value = st.one_of(
        st.integers(-3, 3),
        st.text(max_size=4),
        st.none(),
        st.booleans(),
        st.sampled_from([2.0, 1.5, float("nan")]),
    )
    mutated = st.dictionaries(st.sampled_from(sorted(GOOD_META)), value, max_size=3).map(
        lambda d: json.dumps({**GOOD_META, **d}).encode()
    )
    dropped = st.sampled_from(sorted(GOOD_META)).map(
        lambda k: json.dumps({x: v for x, v in GOOD_META.items() if x != k}).encode()
    )
    return st.one_of(st.just(json.dumps(GOOD_META).encode()), mutated, dropped, st.binary(max_size=40))


def states():
    cut = st.integers(0, len(GOOD_STATE)).map(lambda n: GOOD_STATE[:n])
    flipped = st.tuples(st.integers(0, len(GOOD_STATE) - 1), st.integers(1, 255)).map(
        lambda f: GOOD_STATE[: f[0]] + bytes([GOOD_STATE[f[0]] ^ f[1]]) + GOOD_STATE[f[0] + 1 :]
    )
    return st.one_of(st.just(GOOD_STATE), cut, flipped, st.binary(max_size=64))


@both_suites(fast=100, slow=3000)
def test_fuzzed_checkpoints_resume_or_are_named_damaged(tmp_path, examples):
    good = tmp_path / "run" / "checkpoints" / "main" / "step_1"
    good.mkdir(parents=True)
    (good / "meta.json").write_text(json.dumps({**GOOD_META, "step": 1, "global_step": 1, "version": 1}))
    (good / "trainer_state.pt").write_bytes(GOOD_STATE)
    fuzzed = good.with_name("step_2")
    fuzzed.mkdir()

    @fuzz_settings(examples, derandomize=examples < 1000)
    @given(metas(), states())
    def run(meta, state):
        (fuzzed / "meta.json").write_bytes(meta)
        (fuzzed / "trainer_state.pt").write_bytes(state)
        try:
            point = find_resume_point(tmp_path / "run", ["main"])
            saved = point.trainer_state()
        except CheckpointDamaged as error:
            assert str(fuzzed) in str(error) and f"mv {fuzzed} {fuzzed}.damaged" in str(error)
            return
        # an intact step 2 is resumed from (or step 1, when step 2's meta puts it earlier in the run)
        assert point.path in (fuzzed, good) and isinstance(saved, dict)

    run()

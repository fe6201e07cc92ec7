"""Fuzzed task files (JSON Lines and JSON, valid rows mixed with bytes, other JSON values and deep nesting):
the reader returns tasks or raises a ``TaskDataError`` naming the file; in skip mode every non-blank line
is either a task or a counted skip."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.fuzz_helpers import both_suites, fuzz_settings, json_values, task_reader

from trivium.buffer import TaskDataError

GOOD = {"question": "What is 2+2?", "answer": "#### 4"}


def lines():
    """One line of a JSON Lines file, as bytes (no newline inside)."""
    row = st.fixed_dictionaries(
        {"question": st.one_of(st.text(max_size=10), json_values(4)), "answer": json_values(4)},
        optional={"extra": json_values(4)},
    )
    return st.one_of(
        st.just(json.dumps(GOOD).encode()),
        row.map(lambda r: json.dumps(r, allow_nan=True).encode()),
        json_values(6).map(lambda v: json.dumps(v, allow_nan=True).encode()),
        st.integers(1, 3000).map(lambda d: b'{"question": ' + b"[" * d + b"]" * d + b', "answer": "1"}'),
        st.binary(max_size=30),
        st.sampled_from(
            [b"null", b"", b"   ", b"\xef\xbb\xbf{}", b'{"question": "a"', b"\xff\xfe", b"1" * 5000]
        ),
    ).map(lambda b: b.replace(b"\n", b" "))


def read(path, mode):
    return task_reader(str(path), mode)


@both_suites(fast=150, slow=3000)
def test_fuzzed_jsonl_files(tmp_path, examples):
    @fuzz_settings(examples, derandomize=examples < 1000)
    @given(st.lists(lines(), min_size=1, max_size=12), st.sampled_from(["error", "skip"]))
    def run(rows, mode):
        path = tmp_path / "fuzz.jsonl"
        path.write_bytes(b"\n".join(rows) + b"\n")
        try:
            reader = read(path, mode)
        except TaskDataError as error:
            assert str(path) in str(error) or "task set 'fuzz'" in str(error)
            return
        if mode == "skip":
            # a byte-order mark that opens the file marks its encoding; it is not part of the first row
            first = rows[0].removeprefix(b"\xef\xbb\xbf")
            non_blank = [r for r in [first, *rows[1:]] if r.strip()]
            assert len(reader) + reader.skipped_rows == len(non_blank)
        assert all(isinstance(t.data["question"], str) for t in reader.all_tasks())

    run()


@both_suites(fast=100, slow=1000)
def test_fuzzed_json_files(tmp_path, examples):
    @fuzz_settings(examples, derandomize=examples < 1000)
    @given(
        st.lists(st.one_of(st.just(GOOD), json_values(6)), max_size=8),
        st.binary(max_size=8),
        st.sampled_from(["error", "skip"]),
    )
    def run(values, noise, mode):
        path = tmp_path / "fuzz.json"
        path.write_bytes(
            json.dumps(values, allow_nan=True).encode() + (noise if len(values) % 3 == 0 else b"")
        )
        try:
            reader = read(path, mode)
        except TaskDataError as error:
            assert "task set 'fuzz'" in str(error)
            return
        assert len(reader) + reader.skipped_rows == len(values)

    run()


def test_a_byte_order_mark_alone_on_the_first_line_is_not_a_row(tmp_path):
    """Found by a random slow fuzz run: the mark that opens a UTF-8 file is its encoding, not a row, so
    ``skip`` neither counts nor skips it."""
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b'\xef\xbb\xbf\n{"question": "What is 2+2?", "answer": "#### 4"}\n')
    reader = read(path, "skip")
    assert len(reader) == 1 and reader.skipped_rows == 0

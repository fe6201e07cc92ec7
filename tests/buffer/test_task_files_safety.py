"""Issue 13, item 2: malformed task files are errors naming file, row and line (or counted skips), never a
crash: the reader parses JSON with Python's ``json`` after checking encoding and nesting on the text."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trivium.buffer import TaskDataError, TaskSetReader
from trivium.buffer.task_files import MAX_ROW_DEPTH
from trivium.jsontext import text_depth, value_depth

GOOD = {"question": "What is 1+1?", "answer": "#### 2"}


def reader(path, **kw):
    args = {
        "name": "t",
        "fields": {},
        "required": {"question": (str,), "answer": (str,)},
        "workflow": "math",
        "reward_fn": "math_verify",
        "repeat_times": 1,
    } | kw
    return TaskSetReader(str(path), **args)


def write(tmp_path, data: bytes, name="t.jsonl"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def good_line() -> bytes:
    return json.dumps(GOOD).encode() + b"\n"


def test_a_first_line_null_is_named_not_a_segfault(tmp_path):
    # pyarrow's JSON reader (through HF datasets) killed the process with SIGSEGV on this file: prove it
    # in a child process, so that a regression fails the test instead of the test run.
    path = write(tmp_path, b"null\n" + good_line())
    code = (
        "import sys; from trivium.buffer import TaskSetReader, TaskDataError\n"
        f"try: TaskSetReader({str(path)!r}, name='t', fields={{}}, required={{'question': (str,)}}, "
        "workflow='math', reward_fn='x', repeat_times=1)\n"
        "except TaskDataError as e: print(e); sys.exit(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    assert "row 0 (line 1) is a JSON null, not an object" in done.stdout
    assert "set on_bad_row: skip" in done.stdout


def test_skip_skips_unreadable_lines_and_counts_them(tmp_path):
    lines = [good_line(), b"null\n", b"{not json\n", b"\n", b"[1, 2]\n", b"\xff\xfe oops\n", good_line()]
    lines.append(b'{"question": ' + b"[" * 10_000 + b"]" * 10_000 + b"}\n")
    r = reader(write(tmp_path, b"".join(lines)), on_bad_row="skip")
    assert len(r) == 2 and r.skipped_rows == 5
    assert r.skip_reasons == {
        "row: not an object": 2,
        "row: not JSON": 1,
        "row: not UTF-8": 1,
        "row: too deep": 1,
    }
    # Indices and ids count the file's rows (non-blank lines) before skipping, unreadable ones included.
    assert [t.index for t in r.all_tasks()] == [0, 5]


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        (b"{not json\n", "row 1 (line 2) is not valid JSON"),
        (b"\xff\xfe oops\n", "row 1 (line 2) is not UTF-8 (byte 0xff at column 1)"),
        (b"[" * 10_000 + b"]" * 10_000 + b"\n", "row 1 (line 2) nests values 10000 levels deep"),
        (
            b'{"q": ' + b"[" * 200 + b"]" * 200 + b"}\n",
            f"nests values 201 levels deep (at most {MAX_ROW_DEPTH})",
        ),
        (b'{"q": ' + b"1" * 5000 + b"}\n", "row 1 (line 2) cannot be read as JSON"),
        (b'"just a string"\n', "row 1 (line 2) is a JSON str, not an object"),
    ],
)
def test_error_mode_names_the_file_row_and_line(tmp_path, data, phrase):
    path = write(tmp_path, good_line() + data)
    with pytest.raises(TaskDataError) as info:
        reader(path)
    assert str(path) in str(info.value) and phrase in str(info.value)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_utf16_and_utf32_files_are_named(tmp_path, encoding):
    for name in ("t.jsonl", "t.json"):
        text = json.dumps(GOOD) + "\n" if name == "t.jsonl" else json.dumps([GOOD])
        path = write(tmp_path, text.encode(encoding), name)
        with pytest.raises(TaskDataError, match=r"is UTF-16 or UTF-32.*save it as UTF-8"):
            reader(path, on_bad_row="skip")


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    assert len(reader(write(tmp_path, b"\xef\xbb\xbf" + good_line()))) == 1


def test_json_files_deep_bad_and_not_a_list(tmp_path):
    deep = write(tmp_path, b"[" * 10_000 + b"]" * 10_000, "deep.json")
    with pytest.raises(TaskDataError, match="nests values 10000 levels deep"):
        reader(deep, on_bad_row="skip")
    broken = write(tmp_path, b'[{"question": "x",', "broken.json")
    with pytest.raises(TaskDataError, match=r"is not valid JSON \(Expecting .* at line 1"):
        reader(broken, on_bad_row="skip")
    with pytest.raises(TaskDataError, match=r"must hold a JSON list of objects.*it holds a JSON dict"):
        reader(write(tmp_path, json.dumps(GOOD).encode(), "one.json"))
    mixed = write(tmp_path, json.dumps([GOOD, None, 3, GOOD]).encode(), "mixed.json")
    with pytest.raises(TaskDataError, match="row 1 is a JSON null, not an object"):
        reader(mixed)
    r = reader(mixed, on_bad_row="skip")
    assert [t.index for t in r.all_tasks()] == [0, 3] and r.skip_reasons == {"row: not an object": 2}
    nested = write(tmp_path, json.dumps([GOOD, {"q": [[[[[1]]]]] * 1}]).encode(), "nested.json")
    assert len(reader(nested, on_bad_row="skip")) == 1


def test_memory_rows_that_are_not_dicts_are_skippable():
    r = TaskSetReader(
        [GOOD, None, GOOD],
        name="m",
        fields={},
        required={"question": (str,)},
        workflow="math",
        reward_fn="x",
        repeat_times=1,
        on_bad_row="skip",
    )
    assert len(r) == 2 and r.skipped_rows == 1


def test_max_rows_stops_reading_early(tmp_path):
    path = write(tmp_path, good_line() * 3 + b"{broken\n")
    assert [t.index for t in reader(path, max_rows=3).all_tasks()] == [0, 1, 2]


def test_every_line_unreadable_is_an_error_even_in_skip_mode(tmp_path):
    with pytest.raises(
        TaskDataError, match=r"(?s)has no usable rows.*t\.jsonl row 0 \(line 1\) is a JSON null"
    ):
        reader(write(tmp_path, b"null\n"), on_bad_row="skip", fields={"question": "question"})


def test_paths_with_nul_or_too_long(tmp_path):
    with pytest.raises(TaskDataError, match="cannot use the path"):
        reader("a\x00b.jsonl")
    with pytest.raises(TaskDataError, match="cannot use the path"):
        reader(tmp_path / ("x" * 300 + ".jsonl"))


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("{}", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('{"a": "[[[[[[", "b": "\\"[[["}', 1),  # brackets inside strings (and escaped quotes) do not count
        ("[" * 50 + "]" * 50, 50),
        ("1", 0),
    ],
)
def test_text_depth_matches_the_parsed_depth(text, depth):
    assert text_depth(text) == depth
    assert value_depth(json.loads(text), 1000) == depth


def test_a_lone_surrogate_in_a_text_field_is_a_row_problem(tmp_path):
    path = write(tmp_path, good_line() + b'{"question": "a\\ud800b", "answer": "1"}\n')
    with pytest.raises(TaskDataError, match=r"row 1 \(line 2\): field 'question'.*lone UTF-16 surrogate"):
        reader(path)
    assert reader(path, on_bad_row="skip").skip_reasons == {"question: surrogate": 1}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_bare_nan_or_infinity_in_a_row_is_named_not_read(tmp_path, constant):
    """Issue 26, item 8: Python's json reads NaN as a float, and a task's answer became nan."""
    path = write(tmp_path, good_line() + b'{"question": "q", "answer": ' + constant.encode() + b"}\n")
    with pytest.raises(TaskDataError, match=f"{constant} is not JSON") as info:
        reader(path)
    assert "line 2" in str(info.value)  # the row is named
    as_list = write(tmp_path, b'[{"question": "q", "answer": ' + constant.encode() + b"}]", name="t.json")
    with pytest.raises(TaskDataError, match=f"{constant} is not JSON"):
        reader(as_list)

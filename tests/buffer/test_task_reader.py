import json
import re

import datasets
import pytest

from trivium.buffer import TaskDataError, TaskSetReader

ROWS = [{"problem": f"What is {i}+1?", "solution": f"#### {i + 1}", "level": i % 3} for i in range(10)]
REQUIRED = {"question": (str,), "answer": (str, int, float)}


def reader(path, **kw):
    args = {
        "name": "toy",
        "fields": {"question": "problem", "answer": "solution"},
        "required": REQUIRED,
        "workflow": "math",
        "reward_fn": "math_verify",
        "repeat_times": 4,
    } | kw
    return TaskSetReader(path, **args)


def write_jsonl(path, rows, blank_lines_after=()):
    lines = []
    for i, row in enumerate(rows):
        lines.append(json.dumps(row))
        if i in blank_lines_after:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "folder", "memory"])
def test_reads_every_format_with_field_mapping(tmp_path, fmt):
    if fmt == "jsonl":
        path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    elif fmt == "json":
        path = tmp_path / "t.json"
        path.write_text(json.dumps(ROWS))
    elif fmt == "parquet":
        path = tmp_path / "t.parquet"
        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    elif fmt == "folder":  # files are read in name order: a.jsonl then b.parquet
        path = tmp_path / "data"
        path.mkdir()
        write_jsonl(path / "a.jsonl", ROWS[:4])
        datasets.Dataset.from_list(ROWS[4:]).to_parquet(str(path / "b.parquet"))
        (path / "notes.txt").write_text("ignored")
    else:
        path = ROWS
    r = reader(str(path) if fmt != "memory" else path, fields={"question": "problem", "answer": "solution"})
    tasks = r.all_tasks()
    assert len(r) == len(tasks) == 10
    assert [t.data for t in tasks] == [
        {"question": row["problem"], "answer": row["solution"]} for row in ROWS
    ]
    t = tasks[3]
    assert (t.task_id, t.index, t.taskset, t.workflow, t.reward_fn, t.repeat_times) == (
        "toy:3",
        3,
        "toy",
        "math",
        "math_verify",
        4,
    )
    assert t.raw == ROWS[3]


def test_optional_mapped_fields_and_workflow_args(tmp_path):
    r = reader(
        ROWS,
        fields={"question": "problem", "answer": "solution", "difficulty": "level"},
        workflow_args={"max_tokens": 16},
        is_eval=True,
    )
    t = r.all_tasks()[2]
    assert t.data == {"question": "What is 2+1?", "answer": "#### 3", "difficulty": 2}
    assert t.workflow_args == {"max_tokens": 16} and t.is_eval


BAD_CASES = {
    # kind: (bad row replacing row 2, expected phrases in the error)
    "missing": (
        {"problem": "What is 2+1?"},
        ["field 'answer' (column 'solution')", "has no value (null or absent)"],
    ),
    "null": (
        {"problem": None, "solution": "#### 3"},
        ["field 'question' (column 'problem')", "has no value"],
    ),
    "type": (
        {"problem": "What is 2+1?", "solution": [3]},
        ["field 'answer' (column 'solution') is a list ([3])", "accepts str, int, float"],
    ),
    "empty": (
        {"problem": "  \t ", "solution": "#### 3"},
        ["field 'question'", "empty or whitespace-only text ('  \\t ')"],
    ),
}


@pytest.mark.parametrize("kind", BAD_CASES)
def test_bad_row_error_names_file_row_line_field_and_fix(tmp_path, kind):
    bad, phrases = BAD_CASES[kind]
    rows = [*ROWS[:2], bad, *ROWS[3:]]
    path = write_jsonl(tmp_path / "train.jsonl", rows, blank_lines_after={0})  # row 2 sits on line 4
    with pytest.raises(TaskDataError) as info:
        reader(str(path))
    message = str(info.value)
    assert "task set 'toy': 1 of 10 rows are invalid" in message
    assert f"{path} row 2 (line 4): " in message
    for phrase in phrases:
        assert phrase in message
    assert "set on_bad_row: skip" in message


def test_bool_is_not_an_int_and_values_are_truncated():
    rows = [{"q": "x", "a": True}, {"q": "y" * 500, "a": [0] * 500}]
    with pytest.raises(TaskDataError) as info:
        reader(rows, fields={"question": "q", "answer": "a"}, required={"question": (str,), "answer": (int,)})
    message = str(info.value)
    assert "<memory> row 0: field 'answer' (column 'a') is a bool (True)" in message
    assert "<memory> row 1: field 'answer' (column 'a') is a list ([0, 0, 0" in message
    assert max(len(line) for line in message.splitlines()) < 300


def test_column_absent_from_the_file_is_a_mapping_error_even_in_skip_mode(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    with pytest.raises(TaskDataError) as info:
        reader(str(path), fields={"answer": "solution"}, on_bad_row="skip")  # question -> column "question"
    message = str(info.value)
    assert "has no column 'question' (for field 'question')" in message
    assert "'level', 'problem', 'solution'" in message
    assert "fields: {question: <your column>}" in message


def test_skip_mode_counts_and_keeps_row_indices(tmp_path):
    rows = [*ROWS]
    rows[1] = {"problem": "", "solution": "#### 2"}
    rows[5] = {"problem": "What is 5+1?", "solution": None}
    rows[7] = {"problem": "", "solution": [1]}
    r = reader(str(write_jsonl(tmp_path / "t.jsonl", rows)), on_bad_row="skip")
    assert len(r) == 7 and r.skipped_rows == 3
    assert r.skip_reasons == {"question: empty": 2, "answer: missing": 1, "answer: type": 1}
    assert [t.index for t in r.all_tasks()] == [0, 2, 3, 4, 6, 8, 9]
    assert r.all_tasks()[1].task_id == "toy:2"


def test_no_usable_rows_is_an_error():
    with pytest.raises(TaskDataError, match="has no usable rows"):
        reader([{"problem": " ", "solution": "1"}], on_bad_row="skip")


def test_missing_path_and_bad_extension(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"path '{tmp_path / 'nope.jsonl'}' does not exist")
    ):
        reader(str(tmp_path / "nope.jsonl"))
    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(TaskDataError, match=r"extension '\.csv'; supported: \.jsonl, \.json, \.parquet"):
        reader(str(tmp_path / "t.csv"))


def test_folder_errors_name_the_file_and_its_row(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ROWS[:4])
    write_jsonl(tmp_path / "b.jsonl", [ROWS[4], {"problem": "", "solution": "1"}])
    with pytest.raises(
        TaskDataError, match=re.escape(f"{tmp_path / 'b.jsonl'} row 1 (line 2): field 'question'")
    ):
        reader(str(tmp_path))


def test_invalid_json_line_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + '{"problem": "x", \n')
    with pytest.raises(TaskDataError, match=r"t\.jsonl' row 1 \(line 3\) is not valid JSON"):
        reader(str(path))


def test_valid_jsonl_that_hf_rejects_still_loads(tmp_path):
    # datasets 5.2 fails ("Expected object or value") on a blank line plus a column of mixed types.
    rows = [{"problem": "a", "solution": 1}, {"problem": "b", "solution": "#### 2"}]
    r = reader(str(write_jsonl(tmp_path / "t.jsonl", rows, blank_lines_after={0})))
    assert [t.data["answer"] for t in r.all_tasks()] == [1, "#### 2"]


def test_max_rows_keeps_the_first_rows():
    assert [t.index for t in reader(ROWS, max_rows=3).all_tasks()] == [0, 1, 2]


def ids(batch):
    return [t.index for t in batch]


def test_shuffle_depends_only_on_seed_and_epoch():
    a, b, c = reader(ROWS, seed=1), reader(ROWS, seed=1), reader(ROWS, seed=2)
    epochs_a = [ids(a.next_batch(10)) for _ in range(3)]
    assert epochs_a == [ids(b.next_batch(10)) for _ in range(3)]
    assert epochs_a != [ids(c.next_batch(10)) for _ in range(3)]
    assert all(sorted(e) == list(range(10)) for e in epochs_a)  # each epoch is a permutation
    assert len({tuple(e) for e in epochs_a}) == 3  # and epochs differ
    assert ids(reader(ROWS, shuffle=False).next_batch(10)) == list(range(10))


def test_batch_crossing_an_epoch_boundary():
    r, ref = reader(ROWS[:5], seed=3), reader(ROWS[:5], seed=3)
    epoch0, epoch1 = ids(ref.next_batch(5)), ids(ref.next_batch(5))
    assert ids(r.next_batch(3)) == epoch0[:3]
    assert ids(r.next_batch(3)) == epoch0[3:] + epoch1[:1]
    assert (r.epoch, r.position) == (1, 1)
    assert ids(r.next_batch(12)) == epoch1[1:] + ids(ref.next_batch(5)) + ids(ref.next_batch(5))[:3]
    assert (r.epoch, r.position) == (3, 3)


def test_state_dict_round_trip_continues_the_same_sequence():
    a = reader(ROWS, seed=5)
    for _ in range(7):
        a.next_batch(3)
    state = a.state_dict()
    b = reader(ROWS, seed=5)
    b.load_state_dict(json.loads(json.dumps(state)))  # survives a checkpoint file
    assert (b.epoch, b.position) == (a.epoch, a.position) == (2, 1)
    assert [ids(a.next_batch(4)) for _ in range(5)] == [ids(b.next_batch(4)) for _ in range(5)]


def test_state_for_other_data_is_refused():
    state = reader(ROWS, seed=5).state_dict()
    with pytest.raises(ValueError, match="num_tasks: saved 10, now 9"):
        reader(ROWS[:9], seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="seed: saved 5, now 6"):
        reader(ROWS, seed=6).load_state_dict(state)


def test_argument_errors():
    with pytest.raises(ValueError, match="repeat_times=0 must be >= 1"):
        reader(ROWS, repeat_times=0)
    with pytest.raises(ValueError, match="on_bad_row='drop'; choose 'error' or 'skip'"):
        reader(ROWS, on_bad_row="drop")
    with pytest.raises(ValueError, match="batch_size >= 1"):
        reader(ROWS).next_batch(0)

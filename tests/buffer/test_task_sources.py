"""Task sources (CSV, save_to_disk folders, hub ids offline), task operators, and buffer.tasksets configs."""

import json

import pytest

from trivium.buffer.sources import TASK_OPS, apply_task_ops, source_rows
from trivium.buffer.task_files import TaskDataError
from trivium.config.schema import BufferConfig, OperatorConfig, TaskSetConfig
from trivium.launch import build

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(6)]


def reader(path, **kw):
    return build.task_reader(
        TaskSetConfig(path=str(path), workflow="math", reward_fn="exact_match", **kw), 0, False
    )


def test_a_csv_file_is_a_task_set(tmp_path):
    path = tmp_path / "tasks.csv"
    lines = ["question,answer,level"] + [f'"{r["question"]}",{r["answer"]},{r["level"]}' for r in ROWS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tasks = reader(path).all_tasks()
    assert [t.data["question"] for t in tasks] == [r["question"] for r in ROWS]
    assert [t.data["answer"] for t in tasks] == [r["answer"] for r in ROWS]  # CSV values are strings


def test_a_save_to_disk_folder_and_a_dataset_dict_split(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    assert [t.data["answer"] for t in reader(tmp_path / "one").all_tasks()] == [r["answer"] for r in ROWS]
    both = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:4]), "test": datasets.Dataset.from_list(ROWS[4:])}
    )
    both.save_to_disk(str(tmp_path / "dict"))
    assert len(reader(tmp_path / "dict", split="test")) == 2
    with pytest.raises(TaskDataError, match=r"splits \['test', 'train'\], not 'validation'"):
        reader(tmp_path / "dict", split="validation")


def test_a_hub_id_without_network_names_the_field_the_id_and_hf_hub_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TaskDataError) as err:
        source_rows("openai/gsm8k", subset="main", split="train", field="buffer.tasksets[1].path")
    message = str(err.value)
    assert (
        "buffer.tasksets[1].path" in message and "'openai/gsm8k'" in message and "HF_HUB_OFFLINE" in message
    )
    assert "subset='main'" in message


@pytest.mark.parametrize("name", ["parquet", "JSON", "csv", "text"])
def test_a_file_format_name_is_refused_not_loaded_from_the_working_directory(tmp_path, monkeypatch, name):
    # datasets.load_dataset("parquet") with no data files globs the working directory recursively: in a
    # repository with a virtual environment that ran past the test timeout and then read the wrong files
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rows.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(TaskDataError, match=r"buffer\.taskset\.path: .* name of a file format"):
        source_rows(name, field="buffer.taskset.path")


def test_a_loading_script_is_refused_with_the_way_out(tmp_path):
    script = tmp_path / "my_data.py"
    script.write_text("# a datasets loading script\n")
    with pytest.raises(TaskDataError, match=r"loading script.*save_to_disk"):
        source_rows(str(script), field="buffer.taskset.path")


def test_plain_task_files_stay_with_the_task_reader(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert source_rows(str(path)) is None  # read by task_files, which keeps file-and-line error locations


def ops(*specs):
    return [OperatorConfig(name=n, args=a) for n, a in specs]


def test_builtin_task_operators():
    rows = [
        {"q": "a  b", "a": "1"},
        {"q": "A b", "a": "2"},
        {"q": "longer question", "a": "3"},
        {"q": "", "a": "4"},
    ]
    out = apply_task_ops(rows, ops(("rename", {"mapping": {"q": "question"}})), taskset="t")
    assert [sorted(r) for r in out] == [["a", "question"]] * 4
    out = apply_task_ops(out, ops(("dedup", {"fields": ["question"]})), taskset="t")
    assert [r["a"] for r in out] == ["1", "3", "4"]  # "A b" is "a  b" normalised
    out = apply_task_ops(
        out, ops(("length_filter", {"field": "question", "min_chars": 1, "max_chars": 10})), taskset="t"
    )
    assert [r["a"] for r in out] == ["1"]
    out = apply_task_ops(
        rows, ops(("format_field", {"field": "prompt", "template": "Q: {q} ({a})"})), taskset="t"
    )
    assert out[0]["prompt"] == "Q: a  b (1)"
    out = apply_task_ops(rows, ops(("filter_value", {"field": "a", "keep": ["2", "4"]})), taskset="t")
    assert [r["a"] for r in out] == ["2", "4"]
    with pytest.raises(TaskDataError, match=r"task_ops\[0\] \(format_field\) failed: 'missing'"):
        apply_task_ops(rows, ops(("format_field", {"field": "p", "template": "{missing}"})), taskset="t")


def double_answers(rows, times=2):
    return [{**r, "answer": str(int(r["answer"]) * times)} for r in rows]


def test_task_operators_in_a_task_set_config_and_a_user_operator(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    task_ops = [
        {"name": "filter_value", "args": {"field": "level", "keep": 1}},
        {"name": f"{__name__}:double_answers", "args": {"times": 10}},
    ]
    tasks = reader(path, task_ops=task_ops).all_tasks()
    assert [t.data["answer"] for t in tasks] == ["20", "80"]  # rows 1 and 4 (level 1), answers x 10
    with TASK_OPS.snapshot():
        TASK_OPS.register("double")(double_answers)
        assert [t.data["answer"] for t in reader(path, task_ops=[{"name": "double"}]).all_tasks()][:2] == [
            "0",
            "4",
        ]


def test_tasksets_fill_taskset_and_refuse_both_or_mixed_repeat_times():
    b = BufferConfig(tasksets=[{"path": "a.jsonl", "weight": 3}, {"path": "b.jsonl"}])
    assert b.taskset.path == "a.jsonl" and BufferConfig(**b.model_dump()).taskset == b.tasksets[0]
    with pytest.raises(ValueError, match=r"taskset and buffer\.tasksets are both set"):
        BufferConfig(taskset={"path": "c.jsonl"}, tasksets=[{"path": "a.jsonl"}])
    with pytest.raises(ValueError, match=r"same repeat_times.*\[8, 4\]"):
        BufferConfig(tasksets=[{"path": "a.jsonl"}, {"path": "b.jsonl", "repeat_times": 4}])


def test_a_stage_with_two_weighted_task_sets_and_a_selector_builds_its_feed(
    tmp_path, word_problem_dir, tiny_model_dir
):
    from trivium.validation.load import load_config

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        f"""
mode: both
model: {{path: {tiny_model_dir}}}
buffer:
  batch_size: 4
  total_steps: 2
  selector: online_difficulty
  selector_args: {{target: 0.3}}
  experience_ops: [{{name: zero_variance}}, {{name: format_bonus, args: {{pattern: "####"}}}}]
  tasksets:
    - {{path: {word_problem_dir}/train.jsonl, name: a, weight: 3}}
    - {{path: {word_problem_dir}/test.jsonl, name: b, weight: 1}}
"""
    )
    cfg = load_config(cfg_file).stages[0].config  # validated: every field above is accepted
    feed = build.train_tasks(cfg)
    assert [s.name for s in feed.sources] == ["a", "b"] and feed.sources[0].selector.target == 0.3
    names = [t.task_id.split(":")[0] for t in feed.next_batch(40)]
    assert names.count("a") == 30 and names.count("b") == 10
    assert build.experience_ops(cfg).names() == ["zero_variance", "format_bonus"]


def test_check_semantics_names_bad_selectors_and_operators():
    from trivium.config.schema import TriviumConfig
    from trivium.validation.validate_data import check_data_pipeline

    cfg = TriviumConfig(
        buffer={
            "selector": "online_dificulty",
            "experience_ops": [
                {"name": "format_bonus", "args": {"patern": "x"}},
                {"name": "nope"},
                {"name": "ruler", "args": {"url": "judge:8000"}},  # a bad value, caught before any step
            ],
            "taskset": {"path": "x.jsonl", "task_ops": [{"name": "dedupe"}]},
        }
    )
    problems = {p.path: p for p in check_data_pipeline(cfg, lambda p: p)}
    assert "online_difficulty" in problems["buffer.selector"].fix
    assert "patern" in problems["buffer.experience_ops[0].args"].rule
    assert "buffer.experience_ops[1].name" in problems
    assert "http(s) base URL" in problems["buffer.experience_ops[2].args"].rule
    assert "dedup" in problems["buffer.taskset.task_ops[0].name"].fix
    twice = TriviumConfig(
        algorithm={"overlong_penalty": {"enabled": True}},
        buffer={"experience_ops": [{"name": "overlong_penalty"}]},
    )
    assert "applied twice" in check_data_pipeline(twice, lambda p: p)[0].rule


def test_a_hub_id_is_kept_as_written_and_a_missing_file_is_still_reported(tmp_path):
    from trivium.config.schema import TriviumConfig
    from trivium.validation.validate import check_semantics, resolve_paths

    cfg = TriviumConfig(
        mode="both",
        buffer={
            "tasksets": [
                {"path": "someorg/word-problems", "name": "hub"},
                {"path": "missing.jsonl", "name": "m"},
            ]
        },
    )
    resolved = resolve_paths(cfg, tmp_path)
    assert resolved.buffer.tasksets[0].path == "someorg/word-problems"  # a hub id: not made a local path
    assert resolved.buffer.tasksets[1].path == str(tmp_path / "missing.jsonl")
    missing = [p for p in check_semantics(resolved) if p.rule == "file not found"]
    assert [p.path for p in missing] == ["buffer.tasksets[1].path"]


SFT = [{"prompt": f"What is {i} + {i}?", "response": str(2 * i)} for i in range(4)]
PAIRS = [
    {"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": str(2 * i + 1)} for i in range(4)
]


def write_csv(path, rows):
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_sft_preference_and_expert_data_take_every_source_a_task_set_takes(
    tmp_path, tiny_model_dir, monkeypatch
):
    """One reader for every dataset role: SFT, DPO and expert data from CSV files and save_to_disk folders
    (they read local JSON/JSONL/Parquet only before), and a hub id is tried as a hub id, naming the field."""
    import datasets

    from trivium.buffer.offline import PreferenceReader, SftReader
    from trivium.config.schema import PreferenceDatasetConfig, SftDatasetConfig
    from trivium.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    sft_csv = SftReader(SftDatasetConfig(path=str(write_csv(tmp_path / "sft.csv", SFT))), tokenizer)
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(SFT[:1]), "test": datasets.Dataset.from_list(SFT)}
    ).save_to_disk(str(tmp_path / "sft_disk"))
    sft_disk = SftReader(SftDatasetConfig(path=str(tmp_path / "sft_disk"), split="test"), tokenizer)
    for reader in (sft_csv, sft_disk):
        assert [t.data["response"] for t in reader.reader.all_tasks()] == [r["response"] for r in SFT]
        assert reader.next_batch(2)[0].action_mask.all()  # experiences, loss on the response
    pairs = PreferenceReader(
        PreferenceDatasetConfig(path=str(write_csv(tmp_path / "p.csv", PAIRS))), tokenizer
    )
    assert [p.pair_id for p in pairs.next_batch(4)] and len(pairs) == 4

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        TaskDataError, match=r"buffer\.expert_dataset\.path: .*'someone/demos'.*HF_HUB_OFFLINE"
    ):
        SftReader(SftDatasetConfig(path="someone/demos"), tokenizer, field="buffer.expert_dataset")


def test_csv_cells_encodings_and_row_errors_name_the_file(tmp_path, monkeypatch):
    """Issue 26 item 2: check-config raised tracebacks (rc 1) on a cell over 131,072 characters and on a
    latin-1 file, and a CSV row's error said '<memory> row N'."""
    from trivium.buffer import sources

    big = tmp_path / "big.csv"
    big.write_text("question,answer\n" + f'"{"x" * 200_000}",1\n', encoding="utf-8")
    assert len(reader(big).all_tasks()[0].data["question"]) == 200_000  # beyond csv's default 131,072
    monkeypatch.setattr(sources, "CSV_CELL_LIMIT", 1000)
    with pytest.raises(TaskDataError, match=r"big\.csv line 2: a cell longer than 1,000 characters"):
        reader(big)
    monkeypatch.undo()

    latin = tmp_path / "latin.csv"
    latin.write_bytes("question,answer\nWhat is 2 + 2, señor?,4\n".encode("latin-1"))
    with pytest.raises(TaskDataError, match=r"latin\.csv: byte \d+ .*not utf-8-sig.*iconv -f latin1"):
        reader(latin)
    utf16 = tmp_path / "utf16.csv"
    utf16.write_text('question,answer\n"What is 2 + 2, señor?",4\n', encoding="utf-16")  # with its BOM
    assert reader(utf16).all_tasks()[0].data["question"] == "What is 2 + 2, señor?"

    gap = tmp_path / "gap.csv"
    gap.write_text('question,answer\n"What is\n1 + 1?",2\nWhat is 3 + 3?,\n', encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"gap\.csv row 1 \(line 4\)") as error:
        reader(gap)
    assert "<memory>" not in str(error.value)


def test_check_config_reports_a_bad_csv_as_a_problem_of_the_path(tmp_path, capsys):
    from trivium.cli import main as cli

    (tmp_path / "latin.csv").write_bytes("question,answer\nseñor,4\n".encode("latin-1"))
    (tmp_path / "c.yaml").write_text(
        "model: {path: Qwen/Qwen2.5-0.5B}\nbuffer: {taskset: {path: latin.csv}}\n"
    )
    assert cli(["check-config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "buffer.taskset.path" in err and "Save it as UTF-8" in err and "Traceback" not in err

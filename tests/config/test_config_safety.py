"""Issue 13, item 5: malformed configs and ``--set`` values are problems naming the field (exit 2), never a
traceback; nonsense numbers are refused; YAML bombs and deep nesting are refused cheaply."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from trivium.cli import main as cli
from trivium.config import ConfigError
from trivium.config.safe_yaml import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_NODES, safe_yaml
from trivium.validation import load_config

BASE = "model: {path: Qwen/Qwen2.5-0.5B}\nbuffer: {taskset: {path: train.jsonl}}\n"
ROW = '{"question": "1+1?", "answer": "#### 2"}\n'


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "train.jsonl").write_text(ROW)
    (tmp_path / "c.yaml").write_text(BASE)
    return tmp_path


def problems(path, overrides=()):
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    return info.value.problems


def check_config(capsys, *argv):
    """``trivium check-config`` in this process: (exit code, stderr); a traceback would fail the test."""
    code = cli(["check-config", *map(str, argv)])
    return code, capsys.readouterr().err


def test_a_config_that_is_not_utf8_names_the_byte(folder, capsys):
    (folder / "c.yaml").write_bytes(b"name: caf\xe9\n" + BASE.encode())
    code, err = check_config(capsys, folder / "c.yaml")
    assert (
        code == 2 and "not UTF-8: byte 0xe9 at offset 9 (line 1)" in err and "save the file as UTF-8" in err
    )


def test_a_utf16_config_is_named_as_such(folder):
    (folder / "c.yaml").write_bytes(BASE.encode("utf-16"))
    (p,) = problems(folder / "c.yaml")
    assert "UTF-16" in p.rule and p.fix == "save it as UTF-8"


def test_yaml_nested_1000_deep_is_refused_at_the_limit(folder, capsys):
    (folder / "c.yaml").write_text(BASE + "x: " + "[" * 1000 + "]" * 1000 + "\n")
    code, err = check_config(capsys, folder / "c.yaml")
    assert code == 2 and f"nested deeper than {MAX_DEPTH} levels" in err and "line 3" in err


def bomb(levels: int = 9, width: int = 9) -> str:
    """The classic billion-laughs YAML: each level lists the previous one ``width`` times."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nname: *a{levels - 1}\n"


def test_an_alias_bomb_is_refused_in_a_fraction_of_a_second(folder):
    text = bomb()
    assert len(text) < 600  # 9 ** 9 = 387 million values once expanded
    (folder / "c.yaml").write_text(text)
    tracemalloc.start()
    t0 = time.perf_counter()
    (p,) = problems(folder / "c.yaml")
    elapsed, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "alias bomb" in p.rule and f"limits: {MAX_NODES} values" in p.rule
    assert elapsed < 1.0 and peak < 20e6, (elapsed, peak)


def test_shared_aliases_within_the_limits_still_load():
    assert safe_yaml("a: &x {lr: 1}\nb: *x\nc: [*x, *x]") == {
        "a": {"lr": 1},
        "b": {"lr": 1},
        "c": [{"lr": 1}] * 2,
    }


def test_a_recursive_alias_is_refused():
    with pytest.raises(Exception, match="an alias refers to a value that contains it"):
        safe_yaml("a: &a [*a]")


@pytest.mark.parametrize("name", ["x" * 5000, "a\x00b", "y" * 300 + ".yaml"])
def test_config_paths_too_long_or_with_nul(folder, capsys, name):
    code, err = check_config(capsys, folder / name if "\x00" not in name else name)
    assert code == 2 and ("cannot use this path" in err or "config file not found" in err)
    assert "Traceback" not in err


def test_a_config_file_over_the_size_cap(folder):
    (folder / "c.yaml").write_text(BASE + "#" * MAX_CONFIG_BYTES)
    (p,) = problems(folder / "c.yaml")
    assert f"over the {MAX_CONFIG_BYTES} allowed" in p.rule


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("buffer.taskset.path", "x" * 300),
        ("buffer.taskset.path", '"a\\0b"'),
        ("model.path", "m/" + "y" * 5000),
    ],
)
def test_paths_in_fields_that_no_file_system_accepts(folder, field, value):
    (p,) = problems(folder / "c.yaml", [f"{field}={value}"])
    assert p.path == field and ("NUL" in p.rule or "bytes" in p.rule)


def test_set_with_a_leading_at_sign_is_a_string(folder):
    run = load_config(folder / "c.yaml", ["model.path=@org/model"])
    assert run.stages[0].config.model.path == "@org/model"


def test_set_with_unparsable_yaml_names_the_key(folder, capsys):
    code, err = check_config(capsys, folder / "c.yaml", "--set", "trainer.lr=[x")
    assert code == 2 and "trainer.lr = '[x'" in err and "not a YAML value" in err and "quote" in err


def test_set_key_paths_deeper_than_the_limit(folder):
    (p,) = problems(folder / "c.yaml", [".".join(["a"] * (MAX_DEPTH + 1)) + "=1"])
    assert f"over {MAX_DEPTH} parts" in p.rule


@pytest.mark.parametrize("ref", [":", ".rel:x"])
def test_malformed_part_references_do_not_crash(folder, capsys, ref):
    code, err = check_config(capsys, folder / "c.yaml", "--set", f"algorithm.policy_loss_fn={ref}")
    assert code == 2 and "Traceback" not in err and "problem" in err


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("trainer.lr", ".inf", "finite number"),
        ("explorer.rollout.temperature", ".inf", "finite number"),
        ("explorer.rollout.temperature", "1e-300", "at least 0.001"),
        ("algorithm.kl_loss.coef", ".nan", "finite number"),
        ("seed", "1e29", "integer"),
        ("seed", "-1", "greater than or equal to 0"),
        ("buffer.batch_size", "1e21", "integer"),
        ("buffer.batch_size", "10000000", "less than or equal to 1000000"),
        ("model.tiny", "{vocab_size: 1.0e+11, corpus: [train.jsonl]}", "less than or equal to 1000000"),
        ("buffer.storage", "{read_timeout_s: 1e300}", "less than or equal to"),
        ("trainer.betas", "[.nan, 0.9]", "finite number"),
    ],
)
def test_nonsense_numbers_name_their_field(folder, field, value, rule):
    found = problems(folder / "c.yaml", [f"{field}={value}"])
    assert any(p.path.startswith(field) and rule in p.rule for p in found), [(p.path, p.rule) for p in found]


def test_unknown_tools_of_a_multi_turn_task_set(folder):
    found = problems(
        folder / "c.yaml", ["buffer.taskset.workflow=react", "buffer.taskset.workflow_args={tools: [nope]}"]
    )
    (p,) = found
    assert p.path == "buffer.taskset.workflow_args" and "unknown tool 'nope'" in p.rule


def test_check_config_reads_the_task_files(folder, capsys):
    (folder / "train.jsonl").write_text("null\n" + ROW)
    code, err = check_config(capsys, folder / "c.yaml")
    assert code == 2 and "buffer.taskset.path" in err and "row 0 (line 1) is a JSON null" in err
    code, err = check_config(capsys, folder / "c.yaml", "--set", "buffer.taskset.on_bad_row=skip")
    assert code == 0 and "is valid" in err


def test_run_exits_2_on_a_bad_task_file(folder, capsys):
    (folder / "train.jsonl").write_text("[" * 10_000 + "]" * 10_000 + "\n")
    code = cli(["run", "-c", str(folder / "c.yaml"), "--set", f"checkpoint_root={folder / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 2 and "nests values 10000 levels deep" in err


SERVE = ["mode=serve", "buffer.storage={}", "synchronizer.method=checkpoint", "buffer.total_steps=1"]


def test_serve_on_an_open_host_needs_an_api_key(folder, monkeypatch):
    (p,) = problems(folder / "c.yaml", [*SERVE, "serve.host=0.0.0.0"])
    assert p.path == "serve.host" and "no API key is set" in p.rule
    monkeypatch.setenv("TRIVIUM_TEST_KEY", "   ")
    (p,) = problems(folder / "c.yaml", [*SERVE, "serve.host=0.0.0.0", "serve.api_key_env=TRIVIUM_TEST_KEY"])
    assert p.path == "serve.api_key_env" and "only whitespace" in p.rule
    monkeypatch.setenv("TRIVIUM_TEST_KEY", "s3cret")
    load_config(folder / "c.yaml", [*SERVE, "serve.host=0.0.0.0", "serve.api_key_env=TRIVIUM_TEST_KEY"])
    load_config(folder / "c.yaml", [*SERVE, "serve.host=::1"])  # loopback needs no key


def test_serve_limits_and_reward_bounds(folder):
    (p,) = problems(folder / "c.yaml", [*SERVE, "serve.reward_min=1", "serve.reward_max=1"])
    assert p.path == "serve.reward_min" and "below serve.reward_max" in p.rule
    (p,) = problems(folder / "c.yaml", [*SERVE, "serve.reward_max=.inf"])
    assert p.path == "serve.reward_max" and "finite" in p.rule
    run = load_config(folder / "c.yaml", [*SERVE, "serve.max_n=4", "serve.split_n=2"])
    from trivium.serve.limits import ServeLimits

    limits = ServeLimits.from_config(run.stages[0].config.serve)
    assert (limits.max_n, limits.split_n, limits.max_body_bytes) == (4, 2, 4 << 20)


# ---------------------------------------------------------------- issue 26, items 3 and 4: what the run crashed on
@pytest.mark.parametrize(
    ("device", "rule"),
    [
        ("mps:xyz", "is not a torch device"),
        ("xla", "trivium runs on 'cpu', 'cuda', 'cuda:N' or 'mps'"),
        ("meta", "trivium runs on 'cpu', 'cuda', 'cuda:N' or 'mps'"),
    ],
)
def test_a_device_torch_or_trivium_cannot_use_is_named(folder, device, rule):
    """model.device=mps:xyz passed check-config, then the run died in torch's 'Invalid device string'."""
    (p,) = problems(folder / "c.yaml", [f"model.device={device}"])
    assert p.path == "model.device" and rule in p.rule and "use device: auto" in p.fix


def test_a_model_path_that_is_not_a_model_folder_is_named(folder, capsys):
    """/dev/zero and a folder without config.json passed check-config; the run then printed tracebacks
    (three for /dev/zero, 30 lines of transformers for the folder) that did not name model.path."""
    (p,) = problems(folder / "c.yaml", ["model.path=/dev/zero"])
    assert p.path == "model.path" and "not a folder" in p.rule
    (folder / "empty-model").mkdir()
    (folder / "empty-model" / "notes.txt").write_text("weights go here")
    code, err = check_config(capsys, folder / "c.yaml", "--set", f"model.path={folder / 'empty-model'}")
    assert code == 2 and "model.path" in err and "no config.json" in err
    code = cli(["run", "-c", str(folder / "c.yaml"), "--set", f"model.path={folder / 'empty-model'}"])
    assert code == 2 and "no config.json" in capsys.readouterr().err  # refused before anything loads


def test_a_fifo_named_like_a_task_file_is_refused_not_read(folder, capsys):
    """A FIFO named x.jsonl blocked the reader (and check-config) forever, waiting for a writer."""
    import os

    fifo = folder / "x.jsonl"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    code, err = check_config(capsys, folder / "c.yaml", "--set", f"buffer.taskset.path={fifo}")
    assert code == 2 and "is not a regular file (a pipe, socket or device)" in err
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize(
    ("overrides", "phrase"),
    [
        (["buffer.taskset.workflow=react", "buffer.taskset.workflow_args={tools: 5}"],
         "workflow_args.tools must be a list of tool names, got 5"),
        (["buffer.taskset.workflow=step_wise", "buffer.taskset.workflow_args={env: frozenlake, discount: x}"],
         "workflow_args.discount must be a number in [0, 1], got 'x'"),
    ],
)  # fmt: skip
def test_workflow_args_of_the_wrong_type_are_named_without_python_internals(folder, overrides, phrase):
    """Issue 26, item 8: these said "'int' object is not iterable" and "'<=' not supported"."""
    (p,) = problems(folder / "c.yaml", overrides)
    assert p.path == "buffer.taskset.workflow_args" and phrase in p.rule
    assert "object is not" not in p.rule and "not supported between" not in p.rule


def test_check_config_notes_that_single_choice_serve_traffic_has_no_group_baseline(folder, capsys):
    # GRPO (the default) on calls with one choice each: groups of one, A = R; a note, not an error
    serve = [a for kv in SERVE for a in ("--set", kv)]
    assert cli(["check-config", str(folder / "c.yaml"), *serve]) == 0
    out = capsys.readouterr().out
    assert "# note: " in out and "'grpo' advantages" in out and "reinforceplusplus" in out
    other = ["--set", "algorithm.algorithm_type=reinforceplusplus"]
    assert cli(["check-config", str(folder / "c.yaml"), *serve, *other]) == 0
    assert "# note: " not in capsys.readouterr().out
    assert cli(["check-config", str(folder / "c.yaml")]) == 0  # mode both: the explorer's groups, no note
    assert "# note: " not in capsys.readouterr().out


def test_gigpo_on_a_workflow_without_per_turn_states_is_refused_before_the_run(folder):
    """gigpo groups turns by the state they started from; one experience per episode has no such turns."""
    env = "buffer.taskset.workflow_args={env: frozenlake}"
    (p,) = problems(
        folder / "c.yaml", ["algorithm.algorithm_type=gigpo", "buffer.taskset.workflow=multi_turn", env]
    )
    assert p.path == "buffer.taskset.workflow" and "records no states" in p.rule and "step_wise" in p.fix
    fine = ["algorithm.algorithm_type=gigpo", "buffer.taskset.workflow=step_wise"]
    fine.append(env)
    load_config(folder / "c.yaml", fine)  # no problem at all


def test_reflect_retry_on_an_environment_that_diagnoses_nothing_is_refused_before_the_run(folder):
    """reflect_retry retries what diagnose() names; the calculator's tool environment names nothing."""
    wf = "buffer.taskset.workflow=reflect_retry"
    (p,) = problems(folder / "c.yaml", [wf, "buffer.taskset.workflow_args={env: tools}"])
    assert p.path == "buffer.taskset.workflow_args.env" and "no diagnose()" in p.rule and "step_wise" in p.fix
    load_config(folder / "c.yaml", [wf, "buffer.taskset.workflow_args={env: frozenlake}"])  # no problem


def test_check_config_notes_that_an_explorer_far_ahead_needs_a_staleness_correction(folder, capsys):
    """GRPO with sync_offset 3 learned +3 points instead of +66 (docs/recipes.md): check-config says so."""
    ahead = ["--set", "synchronizer.sync_offset=3"]
    assert cli(["check-config", str(folder / "c.yaml"), *ahead]) == 0
    out = capsys.readouterr().out
    assert "# note: synchronizer.sync_offset: 3 trains on samples up to 3 updates old" in out
    assert "m2po" in out and "rollout_is_cap" in out
    for fix in ("algorithm.algorithm_type=m2po", "algorithm.rollout_is_cap=2", "synchronizer.sync_offset=1"):
        assert cli(["check-config", str(folder / "c.yaml"), *ahead, "--set", fix]) == 0
        assert "# note: " not in capsys.readouterr().out, fix


@pytest.mark.parametrize(
    ("overrides", "field", "rule"),
    [
        (["trainer.optimizer_impl=fused"], "trainer.optimizer_impl", "its own AdamW"),
        (["trainer.strategy=fsdp2", "trainer.world_size=2"], "trainer.optimizer_state_dtype", "FSDP2"),
        (
            ["model.dtype=bfloat16", "trainer.precision=fp32"],
            "trainer.optimizer_state_dtype",
            "float32 weights",
        ),
    ],
)
def test_bf16_optimizer_state_is_refused_where_it_cannot_run(folder, overrides, field, rule):
    found = problems(folder / "c.yaml", ["trainer.optimizer_state_dtype=bfloat16", *overrides])
    assert [(p.path, rule in p.rule) for p in found] == [(field, True)], [(p.path, p.rule) for p in found]
    load_config(folder / "c.yaml", ["trainer.optimizer_state_dtype=bfloat16"])  # alone: fine

"""Config loading and validation: every problem named by its field path, collected in one error."""

import textwrap
from pathlib import Path

import pytest

from trivium.cli import main as cli
from trivium.config import ConfigError, apply_overrides
from trivium.validation import load_config, validate_raw

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart" / "grpo_word_problems.yaml"


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    return tmp_path


def base(**over):
    cfg = {
        "model": {"path": "Qwen/Qwen2.5-0.5B"},  # a hub id: not checked for existence
        "buffer": {"taskset": {"path": "train.jsonl"}},
    }
    for k, v in over.items():
        cfg[k] = v
    return cfg


def problems_of(raw, base_dir):
    with pytest.raises(ConfigError) as info:
        validate_raw(raw, base_dir)
    return info.value


def test_valid_config_resolves_paths(data_dir):
    run = validate_raw(base(), data_dir)
    (stage,) = run.stages
    assert stage.name == "main"
    assert stage.config.buffer.taskset.path == str(data_dir / "train.jsonl")


def test_unknown_key_names_field_and_suggests(data_dir):
    err = problems_of(base(trainer={"lrr": 1e-4}), data_dir)
    (p,) = err.problems
    assert p.path == "trainer.lrr"
    assert p.rule == "unknown key"
    assert "did you mean 'lr'?" in p.fix
    assert "trainer.lrr" in str(err)


def test_wrong_type_names_field(data_dir):
    err = problems_of(base(trainer={"lr": "fast"}), data_dir)
    (p,) = err.problems
    assert p.path == "trainer.lr"
    assert p.value == "fast"
    assert "number" in p.rule


def test_out_of_range_names_field_and_rule(data_dir):
    err = problems_of(base(trainer={"lr": -1.0}), data_dir)
    (p,) = err.problems
    assert p.path == "trainer.lr"
    assert "greater than 0" in p.rule
    assert p.fix


def test_every_problem_reported_at_once(data_dir):
    raw = base(trainer={"lr": -1.0, "ppo_epochz": 2}, explorer={"rollout": {"top_p": 2.0}})
    err = problems_of(raw, data_dir)
    assert {p.path for p in err.problems} == {"trainer.lr", "trainer.ppo_epochz", "explorer.rollout.top_p"}
    assert "3 problems found" in str(err)


def test_semantic_problems_name_fields(data_dir):
    raw = base(algorithm={"algorithm_type": "grpoo"})
    raw["buffer"]["taskset"].update({"path": "missing.jsonl", "reward_fn": "math_verfy", "workflow": "mathh"})
    err = problems_of(raw, data_dir)
    by_path = {p.path: p for p in err.problems}
    assert "did you mean 'grpo'?" in by_path["algorithm.algorithm_type"].fix
    assert by_path["buffer.taskset.path"].rule == "file not found"
    assert "did you mean 'math_verify'?" in by_path["buffer.taskset.reward_fn"].fix
    assert "did you mean 'math'?" in by_path["buffer.taskset.workflow"].fix


def test_eval_task_set_fields_that_evaluation_ignores_are_refused(data_dir):
    raw = base()
    raw["buffer"]["eval_tasksets"] = [
        {"path": "train.jsonl", "repeat_times": 4, "weight": 2.0, "shuffle": False},
        {"path": "train.jsonl", "max_rows": 1},  # what evaluation reads is fine
    ]
    by_path = {p.path: p for p in problems_of(raw, data_dir).problems}
    assert set(by_path) == {f"buffer.eval_tasksets[0].{k}" for k in ("repeat_times", "weight", "shuffle")}
    assert by_path["buffer.eval_tasksets[0].repeat_times"].fix == "set explorer.eval.repeat_times"
    raw["buffer"]["eval_tasksets"] = raw["buffer"]["eval_tasksets"][1:]
    validate_raw(raw, data_dir)


def test_unknown_workflow_field_mapping(data_dir):
    raw = base()
    raw["buffer"]["taskset"]["fields"] = {"questoin": "problem"}
    err = problems_of(raw, data_dir)
    (p,) = err.problems
    assert p.path == "buffer.taskset.fields.questoin"
    assert "did you mean 'question'?" in p.fix


def test_a_reward_s_own_task_fields_may_be_mapped(data_dir):
    """``rubric`` reads a per-task rubric: mapping its column is valid with that reward, not with another."""
    raw = base()
    raw["buffer"]["taskset"]["fields"] = {"rubric": "criteria"}
    (p,) = problems_of(raw, data_dir).problems
    assert p.path == "buffer.taskset.fields.rubric" and "reward 'math_verify'" in p.rule
    raw["buffer"]["taskset"].update(reward_fn="rubric", reward_args={"url": "http://127.0.0.1:9/v1"})
    validate_raw(raw, data_dir)  # valid: no error


def test_mode_and_algorithm_must_agree(data_dir):
    err = problems_of(base(algorithm={"algorithm_type": "sft"}), data_dir)
    assert [p.path for p in err.problems] == ["mode"]


def test_mini_batch_must_divide_batch(data_dir):
    raw = base(trainer={"mini_batch_size": 3})
    err = problems_of(raw, data_dir)
    assert [p.path for p in err.problems] == ["trainer.mini_batch_size"]


def test_stage_problems_are_prefixed(data_dir):
    raw = base(stages=[{"name": "a"}, {"name": "b", "trainer": {"lr": 0}}, {"trainer": {}}])
    err = problems_of(raw, data_dir)
    assert {p.path for p in err.problems} == {"stages[1].trainer.lr", "stages[2].name"}


def test_stages_inherit_and_override(data_dir):
    raw = base(trainer={"lr": 1e-3}, stages=[{"name": "a"}, {"name": "b", "trainer": {"lr": 1e-5}}])
    run = validate_raw(raw, data_dir)
    assert [s.config.trainer.lr for s in run.stages] == [1e-3, 1e-5]
    assert all(s.config.stages == [] for s in run.stages)


def test_overrides_parse_values_and_index_lists():
    raw = {"trainer": {"lr": 1.0}, "stages": [{"name": "a"}, {"name": "b"}]}
    out = apply_overrides(
        raw, ["trainer.lr=1e-5", "stages.1.buffer.batch_size=4", "explorer.rollout.stop=[a, b]"]
    )
    assert out["trainer"]["lr"] == 1e-5
    assert out["stages"][1]["buffer"]["batch_size"] == 4
    assert out["explorer"]["rollout"]["stop"] == ["a", "b"]
    assert raw["trainer"]["lr"] == 1.0  # the input is not mutated
    with pytest.raises(ConfigError, match=r"key\.path=value"):
        apply_overrides(raw, ["trainer.lr"])


@pytest.mark.parametrize(
    "trainer, field",
    [
        ({"betas": [1e59, 0.98]}, "trainer.betas[0]"),  # torch: "Invalid beta parameter" traceback
        ({"betas": [0.9, -1.98]}, "trainer.betas[1]"),
        ({"lr": 1e18}, "trainer.lr"),  # ran to rc 0 with weights near 1e18 and a NaN loss
    ],
)
def test_optimizer_values_torch_refuses_or_that_wreck_the_model_are_config_errors(data_dir, trainer, field):
    (problem,) = problems_of(base(trainer=trainer), data_dir).problems
    assert problem.path == field


def test_a_quoted_override_stays_text(data_dir):
    out = apply_overrides({}, ['name="123"', "project='1e-5'", "seed=123", "trainer.lr=1e-5"])
    assert (out["name"], out["project"], out["seed"], out["trainer"]["lr"]) == ("123", "1e-5", 123, 1e-5)
    run = validate_raw({**base(), **apply_overrides({}, ['name="123"'])}, data_dir)
    assert run.config.name == "123"  # was refused: "Input should be a valid string"


def test_quickstart_config_is_valid():
    run = load_config(QUICKSTART)
    assert [s.name for s in run.stages] == ["sft", "grpo"]
    assert run.stages[0].config.mode == "train"
    assert run.stages[1].config.buffer.taskset.repeat_times == 8


def test_check_config_cli(tmp_path, capsys, data_dir):
    assert cli(["check-config", str(QUICKSTART)]) == 0
    assert "# stage: grpo" in capsys.readouterr().out
    bad = data_dir / "bad.yaml"
    bad.write_text(
        textwrap.dedent("""
        model: {path: Qwen/Qwen2.5-0.5B}
        buffer: {taskset: {path: train.jsonl}, batch_size: 0}
        trainer: {lr: fast}
    """)
    )
    assert cli(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "buffer.batch_size" in err and "trainer.lr" in err
    assert cli(["check-config", str(bad), "--set", "trainer.lr=1e-4", "--set", "buffer.batch_size=2"]) == 0


def test_workflow_args_are_checked_by_the_workflow(data_dir):
    raw = base()
    raw["buffer"]["taskset"]["workflow_args"] = {"prompt_template": "Solve it"}
    err = problems_of(raw, data_dir)
    (p,) = err.problems
    assert p.path == "buffer.taskset.workflow_args"
    assert "{question}" in p.rule
    raw["buffer"]["taskset"]["workflow_args"] = {"temperature": 0.3}
    (p,) = problems_of(raw, data_dir).problems
    assert "temperature" in p.rule


@pytest.mark.parametrize(
    ("rollout", "why"),
    [
        ({"engine_type": "vllm", "autocast_dtype": "bfloat16"}, "vLLM has no autocast"),
        ({"dtype": "bfloat16", "autocast_dtype": "bfloat16"}, "already bfloat16"),
    ],
)
def test_autocast_only_over_fp32_weights_of_the_transformers_engine(data_dir, rollout, why):
    err = problems_of(base(explorer={"rollout": rollout}), data_dir)
    (p,) = [p for p in err.problems if p.path == "explorer.rollout.autocast_dtype"]
    assert why in p.rule and "explorer.rollout.dtype: bfloat16" in p.fix
    validate_raw(base(explorer={"rollout": {"autocast_dtype": "bfloat16"}}), data_dir)  # fp32 weights: fine


def test_in_flight_updates_are_the_transformers_engine_s(data_dir):
    rollout = {"engine_type": "vllm", "in_flight_updates": True}
    (p,) = [p for p in problems_of(base(explorer={"rollout": rollout}), data_dir).problems]
    assert p.path == "explorer.rollout.in_flight_updates" and "engine_type: transformers" in p.fix
    validate_raw(base(explorer={"rollout": {"in_flight_updates": True}}), data_dir)  # transformers: fine


def test_jsonl_storage_refuses_what_an_append_only_file_cannot_do(data_dir):
    raw = base(mode="both")
    raw["buffer"]["storage"] = {"backend": "jsonl", "policy": "replay", "url": "postgresql://h/db"}
    err = problems_of(raw, data_dir)
    assert {p.path for p in err.problems} == {"buffer.storage.policy", "buffer.storage.url"}


@pytest.mark.parametrize(
    ("trainer", "extra", "path", "says"),
    [
        ({"world_size": 2}, {}, "trainer.world_size", "strategy single trains in one process"),
        ({"strategy": "ddp", "world_size": 1000}, {}, "trainer.world_size", "one rank each at most"),
        (
            {"strategy": "fsdp2", "world_size": 2},
            {"mode": "explore", "buffer_storage": True},
            "trainer.strategy",
            "does not train",
        ),
        (
            {"strategy": "ddp", "world_size": 2},
            {"algorithm": {"algorithm_type": "ppo"}},
            "trainer.strategy",
            "PPO's critic",
        ),
    ],
)
def test_strategy_problems_name_the_field(data_dir, trainer, extra, path, says):
    raw = base(trainer=trainer, **{k: v for k, v in extra.items() if k != "buffer_storage"})
    if extra.get("buffer_storage"):
        raw["buffer"]["storage"] = {}
    err = problems_of(raw, data_dir)
    by_path = {p.path: p for p in err.problems}
    assert says in by_path[path].rule


def test_lora_with_a_critic_is_refused(data_dir):
    err = problems_of(
        base(model={"path": "Qwen/Qwen2.5-0.5B", "lora": {"rank": 8}}, algorithm={"algorithm_type": "ppo"}),
        data_dir,
    )
    assert [p.path for p in err.problems] == ["model.lora"]


def test_lora_targets_that_match_no_layer_are_a_config_error(data_dir, tiny_model_dir):
    lora = {"rank": 8, "target_modules": ["q_proj", "query_key"]}
    err = problems_of(base(model={"path": str(tiny_model_dir), "lora": lora}), data_dir)
    (p,) = err.problems
    assert p.path == "model.lora.target_modules" and "['query_key'] match no linear layer" in p.rule
    assert "q_proj" in p.fix
    ok = {"path": str(tiny_model_dir), "lora": {"target_modules": ["q_proj", "mlp.down_proj"]}}
    validate_raw(base(model=ok), data_dir)


def test_cluster_problems_name_the_field(data_dir):
    err = problems_of(base(explorer={"engine_num": 2}), data_dir)
    assert [p.path for p in err.problems] == ["explorer.engine_num"]
    assert "cluster.backend: ray" in err.problems[0].fix
    raw = base(
        cluster={"backend": "ray", "address": "not an address"}, explorer={"rollout": {"engine_type": "vllm"}}
    )
    paths = {p.path for p in problems_of(raw, data_dir).problems}
    assert {"cluster.address", "explorer.rollout.engine_type"} <= paths


def test_cluster_is_run_level(data_dir):
    raw = base()
    raw["stages"] = [{"name": "a", "cluster": {"backend": "ray"}}]
    err = problems_of(raw, data_dir)
    assert any(p.path == "stages[0].cluster" and "run-level" in p.rule for p in err.problems)


def test_reward_args_are_checked_by_the_reward(data_dir):
    raw = base()
    raw["buffer"]["taskset"].update({"reward_fn": "format", "reward_args": {"pattern": "(x"}})
    (p,) = problems_of(raw, data_dir).problems
    assert p.path == "buffer.taskset.reward_args" and "not a valid regular expression" in p.rule
    raw["buffer"]["taskset"]["reward_args"] = {"patern": "x"}
    (p,) = problems_of(raw, data_dir).problems
    assert "unknown args ['patern']" in p.rule and "docs/rewards.md" in p.fix
    raw["buffer"]["taskset"]["reward_args"] = {"pattern": "#### \\d+"}
    validate_raw(raw, data_dir)  # a good one passes

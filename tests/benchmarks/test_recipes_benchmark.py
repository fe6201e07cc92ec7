"""benchmarks/recipes.py and selection.py's spread task set: every variant's config is a run that
check-config accepts, the table and plot come from the rows, the spread task set has its three kinds."""

import importlib.util
import json
import shutil
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from trivium.tasks.agent_tasks import write_frozenlake
from trivium.tasks.word_problems import VERBS
from trivium.validation import load_config

REPO = Path(__file__).resolve().parents[2]


def load(name: str):
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recipes():
    return load("recipes")


def test_every_variant_of_every_recipe_is_a_valid_run(recipes, tiny_model_dir, tmp_path, monkeypatch):
    agents = tmp_path / "agents"  # the FrozenLake example's config next to its data, as make_data writes it
    agents.mkdir()
    shutil.copy(recipes.AGENTS / "frozenlake.yaml", agents)
    write_frozenlake(agents / "data" / "frozenlake", n_train=8, n_test=4, n_sft=8)
    monkeypatch.setattr(recipes, "AGENTS", agents)
    args = Namespace(steps=3, eval_every=1, offset=2, discount=0.9, candidates=3)
    for recipe, (variants, write, _) in recipes.RECIPES.items():
        for name, change in variants(args).items():
            path = write(tiny_model_dir, tmp_path, f"{recipe}-{name}", 0, change, args)
            (stage,) = load_config(path).stages  # validated as check-config does, data files included
            cfg = stage.config
            assert cfg.buffer.total_steps == 3
            assert cfg.algorithm.algorithm_type == change["algorithm"]["algorithm_type"]
            if recipe == "stale":
                assert cfg.synchronizer.sync_offset == (0 if name == "on-policy" else 2)
            elif (
                recipe == "ask"
            ):  # offline turns of the logs, or episodes with the user; evaluated with the user
                assert cfg.buffer.taskset.workflow == change["taskset"]["workflow"]
                assert cfg.buffer.eval_tasksets[0].workflow_args["env"] == "ask_user"
            else:
                assert cfg.buffer.taskset.workflow == change.get("workflow", "step_wise")
                assert cfg.buffer.taskset.workflow_args["discount"] == 0.9
            if recipe == "r3l" and name != "step_wise_grpo":
                assert cfg.buffer.taskset.workflow_args["candidates"] == 3
                assert cfg.buffer.eval_tasksets[0].workflow == "multi_turn"  # evaluation without retries


def test_the_table_and_plot_report_every_seed(recipes, tmp_path):
    rows = [
        {"variant": v, "seed": s, "curve": [(0, 0.2), (4, end)], "extra": {"staleness": 2.0, "masked (m2po)": None},
         "wall_s": 10.0, "steps": 4}
        for v, ends in (("grpo", (0.4, 0.6)), ("m2po", (0.5, 0.7)))
        for s, end in enumerate(ends)
    ]  # fmt: skip
    args = Namespace(recipe="stale", steps=4)
    table = recipes.markdown(rows, ["grpo", "m2po"], args, "eval/test/accuracy", "model")
    assert "| grpo | 0.200 | 0.400, 0.600 | 0.500 ± 0.141 | +0.300 | 2.000 |  | 10 |" in table
    assert "| m2po | 0.200 | 0.500, 0.700 | 0.600 ± 0.141 | +0.400 |" in table
    recipes.plot(rows, ["grpo", "m2po"], args, "eval/test/accuracy", tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_the_spread_task_set_has_easy_hard_and_mislabelled_tasks(tmp_path):
    selection = load("selection")
    rows = [json.loads(x) for x in selection.spread_taskset(tmp_path, 20).read_text().splitlines()]
    assert len(rows) == 60 and len({r["question"] for r in rows}) == 60
    kinds = [rows[k::3] for k in range(3)]  # interleaved: easy, hard, mislabelled, easy, ...

    def confusions(question):
        return [v.confusion for v in VERBS if v.phrase.split(" {n}")[0] in question]

    def right(row):  # the label is the problem's true answer
        value, ops = None, row["answer"].split("\n")[:-1]
        for line in ops:
            value = int(line.split("=")[1])
        return row["answer"].endswith(f"#### {value}")

    assert all(len(confusions(r["question"])) == 1 and confusions(r["question"])[0] <= 0.05 for r in kinds[0])
    assert all(min(confusions(r["question"])) >= 0.6 for r in kinds[1])
    assert all(right(r) for r in kinds[0] + kinds[1]) and not any(right(r) for r in kinds[2])

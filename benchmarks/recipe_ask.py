"""The ``ask`` recipe of ``benchmarks/recipes.py``: Learn-to-Ask from offline dialogues against online GRPO
with a simulated user (``tasks/ask.py``, docs/recipes.md).

Data (``trivium.tasks.ask.write_ask``, into ``<work>/ask-data``): 3,000 logged dialogues of a noisy expert with
the user (the SFT data and the source of the Learn-to-Ask samples), 2,000 problems for the online runs,
300 held-out problems. The SFT stage (a tiny model on the logs) runs once; both variants start from it:

- ``online_grpo``: GRPO over episodes with the simulated user (``multi_turn`` + ``ask_user``, up to 3 turns,
  reward 1 for a right final answer): what plain RL needs, a user to talk to;
- ``learn_to_ask``: GRPO on single turns of the logs (``dialogue`` workflow), each response scored by the
  ``ask`` reward from what the log says was missing at that point: no user, only the logs.

Both are evaluated the same way: greedy episodes with the simulated user on the held-out problems.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

SFT_STEPS = 600
PROJECT = "bench-recipes"


def data(work: Path) -> Path:
    from trivium.tasks.ask import write_ask

    folder = work / "ask-data"
    if not (folder / "learn_to_ask.jsonl").exists():
        write_ask(folder)
    return folder


def base_config(folder: Path) -> dict:
    episodes = {"workflow": "multi_turn", "workflow_args": {"env": "ask_user", "max_turns": 3}}
    return {
        "project": PROJECT,
        "name": "ask-sft",
        "seed": 0,
        "model": {
            "tiny": {
                "corpus": [str(folder / "logs.jsonl"), str(folder / "train.jsonl")],
                "hidden_size": 128,
                "num_layers": 4,
                "num_heads": 4,
                "num_kv_heads": 2,
                "intermediate_size": 512,
                "vocab_size": 384,
            }
        },
        "explorer": {
            "rollout": {"temperature": 1.0, "max_tokens": 24},
            "eval": {"temperature": 0.0},
            "eval_interval": 10,
        },
        "buffer": {"eval_tasksets": [{"path": str(folder / "test.jsonl"), "name": "test", **episodes}]},
        "monitor": {"progress_bar": False},
        "stages": [
            {
                "name": "sft",
                "mode": "train",
                "algorithm": {"algorithm_type": "sft"},
                "buffer": {
                    "batch_size": 32,
                    "total_steps": SFT_STEPS,
                    "sft_dataset": {"path": str(folder / "logs.jsonl"), "format": "messages"},
                },
                "trainer": {
                    "lr": 3.0e-3,
                    "betas": [0.9, 0.98],
                    "lr_scheduler": "cosine",
                    "warmup_steps": 20,
                    "micro_batch_size": 32,
                },
                "explorer": {"eval_at_start": False, "eval_interval": 0},
            }
        ],
    }


def sft(work: Path) -> Path:
    """The SFT stage on the logs, run once into ``work``."""
    done = work / PROJECT / "ask-sft" / "checkpoints" / "sft" / f"step_{SFT_STEPS}" / "model"
    if (done / "model.safetensors").exists():
        return done
    cfg = base_config(data(work))
    cfg["checkpoint_root"] = str(work)
    path = work / "recipes-ask-sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    subprocess.run([sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"], check=True)
    return done


def variants() -> dict[str, dict]:
    return {
        "online_grpo": {
            "algorithm": {"algorithm_type": "grpo"},
            "taskset": {
                "path": "train.jsonl",
                "workflow": "multi_turn",
                "workflow_args": {"env": "ask_user", "max_turns": 3},
            },
        },
        "learn_to_ask": {
            "algorithm": {"algorithm_type": "grpo"},
            "taskset": {"path": "learn_to_ask.jsonl", "workflow": "dialogue", "reward_fn": "ask"},
        },
    }


def config(model: Path, work: Path, name: str, seed: int, change: dict, args) -> Path:
    folder = data(work)
    cfg = base_config(folder)
    cfg.update(name=name, checkpoint_root=str(work), seed=seed)
    cfg["model"] = {"path": str(model)}
    cfg["runtime"] = {"num_threads": 1}
    cfg["explorer"]["eval_interval"] = args.eval_every
    taskset = {**change["taskset"], "path": str(folder / change["taskset"]["path"]), "repeat_times": 8}
    cfg["stages"] = [
        {
            "name": "grpo",
            "mode": "both",
            "algorithm": change["algorithm"],
            "buffer": {"batch_size": 16, "total_steps": args.steps, "taskset": taskset},
            "trainer": {"lr": 2.0e-4, "micro_batch_size": 64, "save_interval": 0},
            "explorer": {"eval_at_start": True},
        }
    ]
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path

"""Human annotation in Studio: a prompt with the answers a run sampled for it, a person picks (and may edit)
the better one, and each pick becomes preference pairs in a JSONL file that DPO trains on
(``buffer.preference_dataset``: ``prompt`` / ``chosen`` / ``rejected`` columns, the prompt being the user
message the answers were sampled for; a ``system`` column keeps the system prompt for reference).

The answers come from the run's ``trajectories.jsonl`` (single-turn samples keep their chat in it): the
samples of one group share a prompt. A group is offered once it has two different answers with text and is
not in the output file yet.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from trivium.monitor.trajectories import read_trajectories
from trivium.studio.files import Guard

__all__ = ["annotation_file", "pending_items", "write_pick"]

_LOCK = threading.Lock()


def annotation_file(guard: Guard, run_id: str) -> Path:
    """Where the pairs of ``run_id`` go: ``annotations/<run id>.jsonl`` in the first config folder (so a DPO
    config next to it names it by a relative path), or under the root when no config folder was given."""
    base = guard.config_dirs[0] if guard.config_dirs else guard.root / ".studio"
    return base / "annotations" / (run_id.replace("/", "__").replace(os.sep, "__") + ".jsonl")


def _groups(guard: Guard, run_id: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for r in read_trajectories(guard.run_dir(run_id)):
        messages = r.get("messages")
        if not messages or r.get("response") is None or messages[-1].get("role") != "user":
            continue
        key = f"{r['global_step']}:{r['group_id']}"
        g = groups.setdefault(
            key,
            {
                "key": key,
                "global_step": r["global_step"],
                "group_id": r["group_id"],
                "prompt": messages[-1]["content"],
                "system": next((m["content"] for m in messages if m.get("role") == "system"), None),
                "answers": [],
            },
        )
        g["answers"].append({"run_index": r["run_index"], "text": r["response"], "reward": r["reward"]})
    # offered once two different answers have text (an empty one is never a side of a pair: write_pick)
    return {
        k: g for k, g in groups.items() if len({a["text"] for a in g["answers"] if a["text"].strip()}) >= 2
    }


def _done(path: Path) -> set[str]:
    if not path.exists():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            keys.add(json.loads(line)["source"]["key"])
        except (ValueError, KeyError, TypeError):
            continue
    return keys


def pending_items(guard: Guard, run_id: str) -> dict[str, Any]:
    path = annotation_file(guard, run_id)
    done = _done(path)
    groups = [
        g
        for k, g in sorted(_groups(guard, run_id).items(), key=lambda kv: kv[1]["global_step"])
        if k not in done
    ]
    return {"file": str(path), "done": len(done), "items": groups}


def write_pick(guard: Guard, run_id: str, key: str, chosen: int, edited: str | None = None) -> dict[str, Any]:
    """Pairs (chosen answer, or its edit, against every other different answer of group ``key``). An empty
    answer is never written as rejected: the preference reader refuses empty text (it would stop the DPO run
    that reads the file); how many were left out is returned."""
    groups = _groups(guard, run_id)
    if key not in groups:
        raise FileNotFoundError(f"run {run_id} has no group {key!r} with two different recorded answers")
    g = groups[key]
    by_index = {a["run_index"]: a for a in g["answers"]}
    if chosen not in by_index:
        raise FileNotFoundError(f"group {key} has no answer {chosen} (answers {sorted(by_index)})")
    text = by_index[chosen]["text"] if edited is None else edited
    if not text.strip():
        raise ValueError("the chosen answer is empty: pick another, or write one")
    rows = [
        {
            "prompt": g["prompt"],
            "chosen": text,
            "rejected": a["text"],
            "system": g["system"],
            "source": {
                "run": run_id,
                "key": key,
                "chosen": chosen,
                "rejected": a["run_index"],
                "edited": edited is not None,
            },
        }
        for a in g["answers"]
        if a["run_index"] != chosen and a["text"] != text and a["text"].strip()
    ]
    empty = sum(a["run_index"] != chosen and not a["text"].strip() for a in g["answers"])
    if not rows:
        raise ValueError(
            f"group {key}: no other answer differs from the chosen one and has text ({empty} empty), so there "
            "is nothing to pair it against: skip it (s)"
        )
    path = annotation_file(guard, run_id)
    with _LOCK:
        if key in _done(path):
            from trivium.studio.runs import Conflict

            raise Conflict(f"group {key} of run {run_id} is already annotated in {path.name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    return {"file": str(path), "pairs": len(rows), "empty_left_out": empty}

"""A run's SQL buffer in Studio: its experiences as trajectory records (decoupled runs, whose trainer may run
in another process or not record ``trajectories.jsonl``), and the serve mode's pending calls to reward.

The buffer is the SQLite file a stage's ``buffer.storage`` names (``buffer.sqlite`` in the run folder by
default), read from the run's ``resolved_config*.yaml``; it must lie under Studio's root like every other
path Studio opens (a PostgreSQL buffer is not shown: Studio reads files only). Rows are listed with
``SqlStorage.peek``: nothing is claimed or changed, so a running trainer is not disturbed. Token texts come
from the run's tokenizer (the run folder's ``base_model`` for a tiny model, else the config's
``model.path``).

Task-set prompts are annotated the same way: ``sample_taskset`` sends a task set's rows (a file in a config
folder) to the serve run's endpoint, ``n`` answers each, so they become pending calls like any other traffic.

A reward sent from Studio goes through the serve mode's own feedback handler (``serve_mode.feedback_route``)
on the same buffer: the same checks (range, unknown call, a reward attached once), the same row updates,
whether or not the serve process is still running.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trivium.studio.files import Guard, OutsideError

__all__ = ["buffer_records", "pending_calls", "sample_taskset", "send_feedback"]

_tokenizers: dict[str, Any] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class _Run:
    """A run folder and its stages' resolved configs, read once per request."""

    id: str
    dir: Path
    configs: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, guard: Guard, run_id: str) -> _Run:
        from trivium.config.safe_yaml import load_yaml

        run_dir = guard.run_dir(run_id)
        configs: list[dict[str, Any]] = []
        for path in sorted(run_dir.glob("resolved_config*.yaml")):
            data = load_yaml(path)
            if isinstance(data, dict):
                configs += [c for c in data.values() if isinstance(c, dict)]
        return cls(run_id, run_dir, tuple(configs))

    def serve(self) -> dict[str, Any]:
        """The ``serve`` section of its serve-mode stage ({} when none)."""
        return next((c["serve"] for c in self.configs if isinstance(c.get("serve"), dict)), {})

    def buffer_file(self, guard: Guard) -> Path:
        for cfg in self.configs:
            storage = (cfg.get("buffer") or {}).get("storage")
            if not isinstance(storage, dict) or storage.get("backend", "sql") != "sql":
                continue
            url = str(storage.get("url") or "")
            if "://" in url and not url.startswith("sqlite:///"):
                raise OutsideError(
                    f"run {self.id}'s buffer is a database server ({url.split('://')[0]}): Studio reads files"
                )
            path = Path(url.removeprefix("sqlite:///")) if url else self.dir / "buffer.sqlite"
            path = guard.inside(path if path.is_absolute() else self.dir / path, "runs")
            if path.exists():
                return path
        default = self.dir / "buffer.sqlite"
        if default.exists():
            return default
        raise FileNotFoundError(f"run {self.id} has no SQL buffer file (buffer.storage) under {self.dir}")

    def storage(self, guard: Guard):
        from trivium.buffer.storage_sql import SqlStorage

        return SqlStorage(self.buffer_file(guard))

    def model_folder(self) -> Path:
        """The folder of the run's model (its tokenizer and config): base_model in the run folder, or
        model.path."""
        candidates = [self.dir / "base_model"]
        candidates += [Path(str((c.get("model") or {}).get("path") or "")) for c in self.configs]
        for path in candidates:
            if str(path) not in ("", ".") and (path / "tokenizer_config.json").exists():
                return path
        raise FileNotFoundError(
            f"run {self.id}: no tokenizer found (base_model in the run folder, or model.path)"
        )

    def tokenizer(self):
        from trivium.models.loading import load_tokenizer

        path = self.model_folder()
        with _lock:
            if str(path) not in _tokenizers:
                _tokenizers[str(path)] = load_tokenizer(path)
            return _tokenizers[str(path)]

    def image_token_id(self) -> int | None:
        """The model's image placeholder token (a vision-language model's config.json), else None."""
        try:
            config = json.loads((self.model_folder() / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        value = config.get("image_token_id")
        return value if isinstance(value, int) else None


def buffer_records(guard: Guard, run_id: str, status: str | None = None, limit: int = 200) -> list[dict]:
    """The newest ``limit`` experiences of the run's buffer (``status``: pending, ready, claimed, consumed, or
    any) as trajectory records; the trainer-side numbers (trainer log-prob, entropy, advantage) are None."""
    from trivium.monitor.trajectories import token_record

    run = _Run.of(guard, run_id)
    tokenizer, image_token = run.tokenizer(), run.image_token_id()
    with run.storage(guard) as storage:
        experiences = storage.peek(status, limit=limit)
    return [
        {
            **token_record(e, tokenizer, image_token),
            "source": "buffer",
            "stage": "buffer",
            "step": e.explore_step,
            "global_step": e.explore_step,
            "reward": None if math.isnan(e.reward) else float(e.reward),  # NaN: a call waiting for feedback
            "trainer_logprob": None,
            "entropy": None,
            "advantage": None,
            "info": {k: e.info[k] for k in ("texts", "choice", "call_ids", "response") if k in e.info},
        }
        for e in experiences
    ]


def pending_calls(guard: Guard, run_id: str, limit: int = 200) -> dict[str, Any]:
    """The serve mode's calls still waiting for a reward, newest first: the prompt and each choice's text."""
    run = _Run.of(guard, run_id)
    tokenizer = run.tokenizer()
    with run.storage(guard) as storage:
        experiences = storage.peek("pending", limit=limit)
        waiting = storage.count("pending")
    calls: dict[str, dict[str, Any]] = {}
    for e in experiences:
        call = calls.setdefault(
            e.task_id,
            {
                "id": e.task_id,
                "prompt": tokenizer.decode(e.tokens[: e.prompt_length].tolist()),
                "model_version": e.model_version,
                "answers": [],
            },
        )
        text = (e.info.get("texts") or [""])[-1]
        call["answers"].append({"choice": int(e.info.get("choice", e.run_index)), "text": text})
    for call in calls.values():
        call["answers"].sort(key=lambda a: a["choice"])
    return {"pending": waiting, "calls": list(calls.values())}


def send_feedback(
    guard: Guard,
    run_id: str,
    call_id: str,
    reward: float,
    choice: int | None = None,
    info: dict | None = None,
) -> dict[str, Any]:
    """A reward for a served call, through the serve mode's feedback handler (its checks and answers)."""
    from trivium.launch.serve_mode import FeedbackRequest, feedback_route

    run = _Run.of(guard, run_id)
    serve = run.serve()
    body = FeedbackRequest(id=call_id, reward=reward, choice=choice, info={"by": "studio", **(info or {})})
    with run.storage(guard) as storage:
        limits = {k: float(serve[k]) for k in ("reward_min", "reward_max") if k in serve}  # else its defaults
        _, handler, _ = feedback_route(storage, **limits)
        return handler(body)


def sample_taskset(
    guard: Guard,
    run_id: str,
    taskset: str,
    field: str = "question",
    count: int = 8,
    n: int = 2,
    offset: int = 0,
) -> dict[str, Any]:
    """Rows ``offset`` .. ``offset + count`` of ``taskset`` (a file in a config folder) sent to the serve run
    ``run_id``'s endpoint as chat calls (``field`` as the user message, ``n`` answers each); the calls are
    then pending in its buffer, to annotate. The API key is read from the variable its ``serve.api_key_env``
    names, as any client would."""
    import json
    import os

    import openai

    from trivium.buffer.task_files import load_rows

    run = _Run.of(guard, run_id)
    info_file = run.dir / "serve.json"
    if not info_file.exists():
        raise FileNotFoundError(f"run {run_id} is not serving (no serve.json): start it with mode serve")
    info = json.loads(info_file.read_text(encoding="utf-8"))
    rows = load_rows(guard.inside(taskset, "configs"), taskset=Path(taskset).stem).rows[
        offset : offset + count
    ]
    prompts = [r.get(field) for r in rows]
    missing = [offset + i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()]
    if missing or not prompts:
        raise ValueError(
            f"{taskset}: rows {missing[:5] or f'from {offset}'} have no text in field {field!r}; name the "
            "field that holds the prompt"
        )
    key_env = run.serve().get("api_key_env")
    client = openai.OpenAI(
        base_url=info["base_url"],
        api_key=(os.environ.get(key_env) if key_env else None) or "none",
        max_retries=0,
    )
    try:
        ids = [
            client.chat.completions.create(
                model=info["model"], messages=[{"role": "user", "content": p}], n=n
            ).id
            for p in prompts
        ]
    except openai.APIError as error:
        raise ValueError(
            f"the serve endpoint of run {run_id} ({info['base_url']}) failed: {error}; is the serve process "
            "still running (serve.json is left behind when it is killed)?"
        ) from error
    return {"sent": len(ids), "calls": ids, "next_offset": offset + len(ids)}

"""The Studio web app: a JSON API over the run folders and config folders, and the page that uses it.

Stack (docs/studio.md says why): FastAPI + uvicorn, already trivium's server for the OpenAI-compatible
endpoint, and one page of plain HTML, CSS and JavaScript modules served from the package (no build step,
no CDN, nothing fetched from the network: it works offline and in a locked-down cluster).

Every path in a request goes through ``Guard`` (``files.py``); errors answer ``{"error": ...}`` with 403
(outside the allowed folders), 404 (no such run or file), 409 (the run's state forbids it) or 422 (a config
with problems, each with its field path, rule and fix).
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from trivium.config.errors import ConfigError
from trivium.serve.schemas import RequestError
from trivium.studio import runs as run_control
from trivium.studio.files import Guard, OutsideError, list_runs, run_summary

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"
MAX_TEXT = 1_000_000  # a config sent to validate or save (bytes)


class ConfigText(BaseModel):
    text: str = Field(max_length=MAX_TEXT)
    folder: str | None = None  # relative paths in the config are taken from this config folder


class SaveRequest(BaseModel):
    path: str = Field(max_length=4096)
    text: str = Field(max_length=MAX_TEXT)


class PickRequest(BaseModel):
    id: str = Field(max_length=4096)
    key: str = Field(max_length=64)
    chosen: int
    edited: str | None = Field(None, max_length=MAX_TEXT)


class FeedbackRequest(BaseModel):
    id: str = Field(max_length=4096)  # the run
    call: str = Field(min_length=1, max_length=255)  # the served call's id
    reward: float = Field(allow_inf_nan=False)
    choice: int | None = Field(None, ge=0)


class SampleRequest(BaseModel):
    id: str = Field(max_length=4096)  # the serve run
    taskset: str = Field(max_length=4096)  # a file in a config folder
    field: str = Field("question", max_length=255)
    count: int = Field(8, ge=1, le=256)
    n: int = Field(2, ge=1, le=16)
    offset: int = Field(0, ge=0)


class LaunchRequest(BaseModel):
    config: str = Field(max_length=4096)
    overrides: list[str] = Field(default_factory=list, max_length=64)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
READS = ("GET", "HEAD", "OPTIONS")


def create_app(
    root: str | Path,
    config_dirs: list[str | Path],
    token: str | None = None,
    *,
    token_for_reads: bool = True,
    allowed_hosts: tuple[str, ...] = (),
) -> FastAPI:
    """The Studio app. ``token``: the access token requests must present (Bearer header, the cookie the
    printed URL sets, or ``?token=``), on every request, or with ``token_for_reads=False`` only on those
    that change something or import code (every method but GET/HEAD/OPTIONS: launching, saving, validating
    a config, which imports its plugins). ``allowed_hosts``: names besides the loopback ones that requests
    may address (the ``Host`` header) and come from (the ``Origin`` header of a write) where reads need no
    token: anything else is refused, so a foreign page cannot reach Studio by DNS rebinding or a cross-site
    form."""
    guard = Guard.of(root, config_dirs)
    app = FastAPI(title="trivium studio", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.guard = guard
    _guard_access(app, token, token_for_reads, allowed_hosts)
    _error_answers(app)
    _page_and_info(app, guard)
    _config_routes(app, guard)
    _run_routes(app, guard)
    _annotation_routes(app, guard)
    return app


def _guard_access(
    app: FastAPI, token: str | None, token_for_reads: bool, allowed_hosts: tuple[str, ...]
) -> None:
    """The middleware that checks every request's addressed name, origin and token (``create_app``)."""
    allowed = {h.lower().strip("[]") for h in (*LOOPBACK_NAMES, *allowed_hosts)}

    def known(host: str) -> bool:
        return host in allowed or host.endswith(".localhost")

    # A token on every request (a network bind) keeps foreign pages out by itself: they cannot read it, and
    # its cookie is same-site only; the names are checked where reads need no token (loopback).
    check_names = token is None or not token_for_reads

    @app.middleware("http")
    async def access(request: Request, call_next):
        host = _hostname(request.headers.get("host", ""))
        if check_names and not known(host):
            return JSONResponse(
                {
                    "error": f"Studio answers requests addressed to {sorted(allowed)}, not to {host!r}: a page "
                    "of another site may be reaching it through DNS rebinding. To open Studio under that "
                    "name, start it with --allowed-host " + (host or "NAME")
                },
                403,
            )
        origin = request.headers.get("origin")
        if check_names and request.method not in READS and origin and not known(_hostname(origin, url=True)):
            return JSONResponse(
                {"error": f"Studio refuses changes asked by a page of {origin}: only its own page may ask"},
                403,
            )
        if token is None:
            return await call_next(request)
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        given = given or request.cookies.get("trivium_studio", "") or request.query_params.get("token", "")
        valid = hmac.compare_digest(given.encode(), token.encode())
        if not valid and (token_for_reads or request.method not in READS):
            return JSONResponse({"error": "this Studio needs its access token: open the URL it printed"}, 401)
        response = await call_next(request)
        if valid and request.query_params.get("token"):  # the printed URL: the page's calls carry it after
            response.set_cookie("trivium_studio", token, httponly=True, samesite="strict")
        return response


def _error_answers(app: FastAPI) -> None:
    """What each error of a route answers: 403 outside the folders, 404, 409, 422 with the problems."""

    @app.exception_handler(OutsideError)
    async def _outside(request, error):
        return JSONResponse({"error": str(error)}, 403)

    @app.exception_handler(FileNotFoundError)
    async def _missing(request, error):
        return JSONResponse({"error": str(error)}, 404)

    @app.exception_handler(run_control.Conflict)
    async def _conflict(request, error):
        return JSONResponse({"error": str(error)}, 409)

    @app.exception_handler(RequestError)
    async def _request(request, error):  # the serve mode's feedback handler: 400, 404 or 409 with its text
        return JSONResponse({"error": error.message}, error.status)

    @app.exception_handler(ConfigError)
    async def _config(request, error):
        return JSONResponse({"error": str(error).splitlines()[0], "problems": _problems(error)}, 422)


def _page_and_info(app: FastAPI, guard: Guard) -> None:
    """The page, its static files, what Studio serves and the config schema the builder is made from."""

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        from trivium import __version__

        return {
            "version": __version__,
            "root": str(guard.root),
            "configs": [str(d) for d in guard.config_dirs],
        }

    @app.get("/api/schema")
    def schema() -> dict[str, Any]:
        from trivium.config.schema import TriviumConfig

        return TriviumConfig.model_json_schema()


def _config_routes(app: FastAPI, guard: Guard) -> None:
    """Config files: list, read, validate, explain (doctor) and save."""

    @app.post("/api/validate")
    def validate(body: ConfigText) -> dict[str, Any]:
        """The config's problems (each on its field), through the same checks as ``trivium check-config``."""
        return _validate(guard, body.text, body.folder)

    @app.post("/api/doctor")
    def doctor(body: ConfigText) -> dict[str, Any]:
        """``trivium doctor``'s text for the config: per stage, every derived quantity and the memory estimate."""
        from trivium.config.safe_yaml import safe_yaml
        from trivium.launch.config_doctor import explain
        from trivium.validation.load import validate_raw

        base = (
            guard.inside(body.folder, "configs") if body.folder else (guard.config_dirs or (guard.root,))[0]
        )
        raw = safe_yaml(body.text, "the config")
        if not isinstance(raw, dict):
            raise run_control.Conflict("a config is a mapping (key: value lines)")
        text, facts = explain(validate_raw(raw, base_dir=base, source="the config"))
        return {"text": text, "stages": len(facts)}

    @app.get("/api/configs")
    def configs() -> list[dict[str, str]]:
        out = []
        for folder in guard.config_dirs:
            for path in sorted(folder.rglob("*.y*ml"))[:500]:
                if path.suffix in (".yaml", ".yml") and not any(p.startswith(".") for p in path.parts):
                    out.append(
                        {"path": str(path), "name": str(path.relative_to(folder)), "folder": str(folder)}
                    )
        return out

    @app.get("/api/configs/read")
    def read_config(path: str) -> PlainTextResponse:
        return PlainTextResponse(guard.inside(path, "configs").read_text(encoding="utf-8"))

    @app.get("/api/configs/parsed")
    def parsed_config(path: str) -> dict[str, Any]:
        """A config file as data, for the builder's form."""
        from trivium.config.safe_yaml import load_yaml

        return load_yaml(guard.inside(path, "configs"))

    @app.post("/api/configs/save")
    def save_config(body: SaveRequest) -> dict[str, Any]:
        """Write a config into a config folder (YAML that parses to a mapping); its problems come back too."""
        path = guard.inside(body.path, "configs")
        if path.suffix not in (".yaml", ".yml"):
            raise run_control.Conflict(f"{body.path!r}: a config file name ends with .yaml")
        checked = _validate(guard, body.text, str(path.parent))
        if checked["parse_error"]:
            raise run_control.Conflict(f"not saved: {checked['problems'][0]['rule']}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body.text, encoding="utf-8")
        return {"saved": str(path), **checked}


def _run_routes(app: FastAPI, guard: Guard) -> None:
    """Runs: launch and stop; their list, state, metrics, resolved config, log, failures and recorded
    trajectories."""

    @app.post("/api/runs/launch")
    def launch(body: LaunchRequest) -> dict[str, Any]:
        return run_control.launch(guard, body.config, body.overrides)

    @app.post("/api/run/stop")
    def stop(id: str) -> dict[str, Any]:
        return run_control.stop(guard, id)

    @app.get("/api/runs")
    def runs() -> list[dict[str, Any]]:
        return list_runs(guard)

    @app.get("/api/run")
    def run(id: str) -> dict[str, Any]:
        return run_summary(guard, guard.run_dir(id))

    @app.get("/api/run/metrics")
    def metrics(id: str) -> Response:
        folder = guard.run_dir(id)
        lines = []
        for path in [folder / "metrics.jsonl", *sorted(folder.glob("metrics.*.jsonl"))]:
            if path.exists():
                lines += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return Response("[" + ",".join(_complete(lines)) + "]", media_type="application/json")

    @app.get("/api/run/config")
    def run_config(id: str) -> PlainTextResponse:
        folder = guard.run_dir(id)
        found = sorted(folder.glob("resolved_config*.yaml"))
        if not found:
            raise FileNotFoundError(f"run {id} has no resolved_config.yaml yet")
        return PlainTextResponse("\n".join(p.read_text(encoding="utf-8") for p in found))

    @app.get("/api/run/log")
    def run_log(id: str) -> dict[str, Any]:
        folder = guard.run_dir(id)
        failures = folder / "failures.jsonl"
        tail = failures.read_text(encoding="utf-8").splitlines()[-50:] if failures.exists() else []
        return {"log": run_control.log_tail(guard, id), "failures": [json.loads(x) for x in _complete(tail)]}

    @app.get("/api/run/image")
    def run_image(id: str, ref: str) -> FileResponse:
        """One picture of the run's image store (``<run>/images``, by its reference): what a vision-language
        sample saw, for the trajectory viewer."""
        from trivium.models.vision import ImageError, ImageStore

        store = ImageStore(guard.run_dir(id) / "images")
        try:
            path = store.path(ref)
        except ImageError as error:
            raise RequestError(f"ref: {error}") from None
        if not path.is_file():
            raise FileNotFoundError(f"run {id} has no image {ref[:12]}... in its images/ folder")
        return FileResponse(
            path, media_type="image/png", headers={"Cache-Control": "max-age=86400, immutable"}
        )

    @app.get("/api/run/trajectories")
    def trajectories(
        id: str,
        step: int | None = None,
        sort: str = "step",
        descending: bool = False,
        limit: int = 50,
        source: str = "recorded",
    ) -> dict[str, Any]:
        """Recorded samples (``monitor.trajectories``), or the newest experiences of the run's SQL buffer
        (``source=buffer``), filtered by step and sorted by step, reward, length or mean advantage."""
        from trivium.monitor.trajectories import read_trajectories

        if source == "buffer":  # the run's SQL buffer (decoupled runs): rollout numbers only
            from trivium.studio.buffer_view import buffer_records

            records = buffer_records(guard, id, status=None, limit=500)
        elif source == "recorded":
            records = read_trajectories(guard.run_dir(id))
        else:
            raise run_control.Conflict(f"source={source!r}: use 'recorded' (trajectories.jsonl) or 'buffer'")
        steps = sorted({(r["global_step"], r["stage"], r["step"]) for r in records})
        if step is not None:
            records = [r for r in records if r["global_step"] == step]
        keys = {
            "step": lambda r: (r["global_step"], r["group_id"]),
            "reward": lambda r: -1e30 if r["reward"] is None else r["reward"],
            "length": lambda r: len(r["response_ids"]),
            "advantage": lambda r: (
                sum(a for a, m in zip(r["advantage"] or [], r["mask"]) if m) / max(1, sum(r["mask"]))
            ),
        }
        if sort not in keys:
            raise run_control.Conflict(f"sort={sort!r}: sort by one of {sorted(keys)}")
        records = sorted(records, key=keys[sort], reverse=descending)
        return {
            "steps": [{"global_step": g, "stage": s, "step": n} for g, s, n in steps],
            "total": len(records),
            "records": records[: max(1, min(limit, 500))],
        }


def _annotation_routes(app: FastAPI, guard: Guard) -> None:
    """Annotation: preference picks on recorded samples, rewards for a serve run's calls."""

    @app.get("/api/annotate")
    def annotate_items(id: str) -> dict[str, Any]:
        """Groups of a run's recorded samples still to annotate (a prompt and its different answers)."""
        from trivium.studio.annotate import pending_items

        return pending_items(guard, id)

    @app.post("/api/annotate")
    def annotate_pick(body: PickRequest) -> dict[str, Any]:
        """The better answer of a group (or its edit): preference pairs appended to the run's file."""
        from trivium.studio.annotate import write_pick

        try:
            return write_pick(guard, body.id, body.key, body.chosen, body.edited)
        except ValueError as error:
            raise run_control.Conflict(str(error)) from error

    @app.get("/api/annotate/calls")
    def annotate_calls(id: str) -> dict[str, Any]:
        """The serve mode's calls of a run still waiting for a reward (its SQL buffer's pending rows)."""
        from trivium.studio.buffer_view import pending_calls

        return pending_calls(guard, id)

    @app.post("/api/annotate/feedback")
    def annotate_feedback(body: FeedbackRequest) -> dict[str, Any]:
        """A reward for a served call, through the serve mode's feedback path."""
        from trivium.studio.buffer_view import send_feedback

        return send_feedback(guard, body.id, body.call, body.reward, body.choice)

    @app.post("/api/annotate/sample")
    def annotate_sample(body: SampleRequest) -> dict[str, Any]:
        """A task set's prompts sent to a serve run's endpoint (n answers each): pending calls to annotate."""
        from trivium.studio.buffer_view import sample_taskset

        try:
            return sample_taskset(guard, body.id, body.taskset, body.field, body.count, body.n, body.offset)
        except ValueError as error:
            raise run_control.Conflict(str(error)) from error


def _complete(lines: list[str]) -> list[str]:
    """JSON lines that parse (the last one may be half written while a run appends)."""
    out = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            continue
        out.append(line)
    return out


def _problems(error: ConfigError) -> list[dict[str, Any]]:
    return [
        {"path": p.path, "value": repr(p.value)[:200], "rule": p.rule, "fix": p.fix} for p in error.problems
    ]


def _validate(guard: Guard, text: str, folder: str | None) -> dict[str, Any]:
    """``{ok, problems, parse_error, stages}`` for a config's YAML text."""
    from trivium.config.safe_yaml import safe_yaml
    from trivium.validation.load import validate_raw

    base = guard.inside(folder, "configs") if folder else (guard.config_dirs or (guard.root,))[0]
    try:
        raw = safe_yaml(text, "the config")
    except ConfigError as error:
        return {"ok": False, "parse_error": True, "problems": _problems(error), "stages": []}
    except Exception as error:  # yaml.YAMLError and what the safe loader refuses
        problem = {"path": "", "value": "", "rule": f"not valid YAML: {error}", "fix": "fix the YAML"}
        return {"ok": False, "parse_error": True, "problems": [problem], "stages": []}
    if not isinstance(raw, dict):
        problem = {
            "path": "",
            "value": type(raw).__name__,
            "rule": "a config is a mapping",
            "fix": "key: value lines",
        }
        return {"ok": False, "parse_error": True, "problems": [problem], "stages": []}
    try:
        run_cfg = validate_raw(raw, base_dir=base, source="the config")
    except ConfigError as error:
        return {"ok": False, "parse_error": False, "problems": _problems(error), "stages": []}
    return {"ok": True, "parse_error": False, "problems": [], "stages": [s.name for s in run_cfg.stages]}


def _hostname(value: str, url: bool = False) -> str:
    """The host name of a ``Host`` header (``name:port``, ``[::1]:port``) or of an ``Origin`` URL, lower case."""
    if url:
        from urllib.parse import urlsplit

        return (urlsplit(value).hostname or "").lower()
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value

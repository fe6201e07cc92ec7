"""An OpenAI-compatible endpoint over a rollout model, so agents written for the OpenAI API produce
training data: every call is recorded as token ids and engine log-probs (see ``recorder.py``).

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
and the same ``/v1`` routes under ``/sessions/{session_id}`` for per-agent recording.

Design decisions (request handling itself: ``service.py``):
- Generation runs in the request's worker thread (sync endpoints run in the server's thread pool), never
  on the event loop, so health checks and other agents' requests stay served while a batch decodes.
  With a ``BatchingRolloutModel``, concurrent requests (from outside any ``worker()`` context) join a
  batch within its ``max_wait_s``; with a bare engine they run one after another under its lock.
- ``/health`` is open (it also says how many generation turns run and wait); every ``/v1`` route needs
  ``Authorization: Bearer <api_key>`` when a key is set. Keys are compared in constant time; a key that is
  empty or whitespace is refused at start, and so is a host other than loopback without a key: a server
  reachable from the network must not serve (and record) anybody's traffic.
- Limits (``limits.py``): bodies are bounded in size, read time and JSON nesting before parsing;
  generation runs in fair turns; see ``ServeLimits``.
- Every error is ``{"error": {"message", "type", "param"}}`` with a 4xx status for bad requests (401 for a
  missing key, 404 for unknown sessions or routes, 408/413 for slow or large bodies), 503 when the server
  is too busy, and 500 for failures of the server (logged with the last frames of the traceback only); the
  server stays up.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trivium.models.protocol import SamplingParams
from trivium.net import is_loopback
from trivium.serve.limits import BodyLimit, ServeLimits
from trivium.serve.recorder import Recorder
from trivium.serve.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorDetail,
    ErrorResponse,
    RequestError,
)
from trivium.serve.service import Service

__all__ = ["OpenAIServer", "create_app"]

log = logging.getLogger(__name__)


def create_app(
    model: Any,
    *,
    model_name: str,
    recorder: Recorder | None = None,
    api_key: str | None = None,
    default_params: SamplingParams | None = None,
    extra_routes: Sequence[tuple[str, Callable[..., Any], Sequence[str]]] = (),
    limits: ServeLimits | None = None,
    health_info: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """A FastAPI app serving ``model`` (a RolloutModel: ``.tokenizer``, ``.version``, ``.generate``).

    Without ``recorder`` nothing is recorded and ``/sessions/...`` routes answer 404. Serving the app with
    your own server? Call ``recorder.bind(root_url, api_key)`` so that ``session.client()`` knows the URL.
    ``extra_routes``: ``(path, endpoint, methods)`` served like the ``/v1`` routes (API key, error format),
    e.g. serve mode's ``POST /feedback``. ``limits``: ``ServeLimits()`` when None. ``health_info()``:
    more entries for ``/health`` (serve mode: the weights being followed).
    """
    _check_key(api_key)
    limits = limits or ServeLimits()
    service = Service(model, model_name, recorder, default_params, limits)
    app = FastAPI(title=f"trivium: {model_name}")
    app.state.service = service
    app.add_middleware(BodyLimit, limits=limits)
    _install_error_handlers(app)
    auth = [Depends(_auth_check(api_key))]

    @app.get("/health")
    def health() -> dict[str, Any]:
        sessions = 0 if recorder is None else len(recorder.sessions)
        turns = {"running": service.gate.running, "waiting": service.gate.waiting}
        return {
            "status": "ok",
            "model": model_name,
            "version": model.version,
            "sessions": sessions,
            "turns": turns,
            **(health_info() if health_info is not None else {}),
        }

    def models() -> dict[str, Any]:
        entry = {"id": model_name, "object": "model", "created": service.started, "owned_by": "trivium"}
        return {"object": "list", "data": [entry]}

    def chat(body: ChatCompletionRequest) -> Any:
        return service.chat(body, None)

    def chat_in_session(session_id: str, body: ChatCompletionRequest) -> Any:
        return service.chat(body, session_id)

    def completions(body: CompletionRequest) -> Any:
        return service.completion(body, None)

    def completions_in_session(session_id: str, body: CompletionRequest) -> Any:
        return service.completion(body, session_id)

    def session_models(session_id: str) -> dict[str, Any]:
        service.session(session_id)  # 404 for an unknown session
        return models()

    routes = [
        ("/v1/models", models, ["GET"]),
        ("/v1/chat/completions", chat, ["POST"]),
        ("/v1/completions", completions, ["POST"]),
        ("/sessions/{session_id}/v1/models", session_models, ["GET"]),
        ("/sessions/{session_id}/v1/chat/completions", chat_in_session, ["POST"]),
        ("/sessions/{session_id}/v1/completions", completions_in_session, ["POST"]),
        *extra_routes,
    ]
    for path, endpoint, methods in routes:
        app.add_api_route(path, endpoint, methods=methods, dependencies=auth, response_model=None)
    return app


# ------------------------------------------------------------------------------------------ HTTP plumbing
def _check_key(api_key: str | None) -> None:
    if api_key is not None and not api_key.strip():
        raise ValueError(
            "api_key is empty or whitespace: anybody could send it. Use a real key (e.g. `openssl rand -hex 32`) "
            "or api_key=None to serve without one on loopback"
        )


def _auth_check(api_key: str | None):
    expected = None if api_key is None else api_key.strip().encode()  # a key read from a file ends in "\n"

    def check(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            raise RequestError(
                "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the server's api_key",
                status=401,
                kind="authentication_error",
            )

    return check


def _error(status: int, message: str, param: str | None = None, kind: str = "") -> JSONResponse:
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    body = ErrorResponse(error=ErrorDetail(message=message, type=kind, param=param))
    headers = {"Retry-After": "5"} if status == 503 else None  # busy: come back soon
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _install_error_handlers(app: Any) -> None:
    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.param, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems, params = [], []
        content_type = request.headers.get("content-type", "")
        for e in exc.errors():
            if tuple(e["loc"]) == ("body",) and "json" not in content_type.lower():
                # FastAPI reads a body as JSON only when it says so: valid JSON sent as text/plain arrives
                # as a string, and "not an object" would send the caller after the wrong fault
                problems.append(
                    f"the request body must be sent with Content-Type: application/json "
                    f"(this one says {content_type or 'nothing'!r})"
                )
                params.append(None)
                continue
            if e["type"] == "json_invalid":
                problems.append(
                    f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e['msg'])}"
                )
                params.append(None)
                continue
            param = ".".join(str(x) for x in e["loc"] if x != "body") or "body"
            text = f"{param}: {str(e['msg']).removeprefix('Value error, ')}"
            value = e.get("input")
            if e["type"] != "missing" and not isinstance(value, (dict, list)):
                text += f" (got {value!r:.80})"
            problems.append(text if len(text) <= 600 else text[:597] + "...")  # values may be huge
            params.append(param)
        return _error(400, "; ".join(problems), params[0] if params else None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"{exc.detail}: {request.method} {request.url.path}"
        if exc.status_code == 404:
            message += (
                " (routes: /health, /v1/models, /v1/chat/completions, /v1/completions, /sessions/{id}/v1/...)"
            )
        return _error(exc.status_code, message)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        # The last frames say where it failed; a RecursionError's thousand frames would flood the log.
        frames = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-20))
        log.error("request %s %s failed:\n%s", request.method, request.url.path, frames[-20_000:])
        return _error(500, f"the server failed on this request: {type(exc).__name__}: {str(exc)[:500]}")


# ------------------------------------------------------------------------------------------ server
class OpenAIServer:
    """``create_app`` served by uvicorn in a background thread; a context manager.

    ``port=0`` picks a free port; it is known after ``start()`` (``.port``, ``.url``, ``.base_url``).
    ``base_url`` is what ``openai.OpenAI(base_url=...)`` takes (``.../v1``); sessions have their own
    (``session.base_url``). The recorder is bound to the server's URL and key on start. ``drive_batches``:
    run a batching model's batches on a thread of the server (``runner.py``; serve mode does), not when
    an explorer drives the same model.
    """

    def __init__(
        self,
        model: Any,
        *,
        model_name: str,
        recorder: Recorder | None = None,
        api_key: str | None = None,
        default_params: SamplingParams | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        extra_routes: Sequence[tuple[str, Callable[..., Any], Sequence[str]]] = (),
        limits: ServeLimits | None = None,
        drive_batches: bool = False,
        health_info: Callable[[], dict[str, Any]] | None = None,
    ):
        if api_key is None and not is_loopback(host):
            raise ValueError(
                f"host {host!r} accepts connections from other machines, and no api_key is set: anybody could "
                "use the model and write into its training data. Set an api_key (serve.api_key_env), or serve "
                "on 127.0.0.1"
            )
        self.app = create_app(
            model,
            model_name=model_name,
            recorder=recorder,
            api_key=api_key,
            default_params=default_params,
            extra_routes=extra_routes,
            limits=limits,
            health_info=health_info,
        )
        self.recorder, self.api_key, self.drive_batches = recorder, api_key, drive_batches
        self.host, self.port, self.log_level = host, port, log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout_s: float = 30.0) -> OpenAIServer:
        """Bind the socket, start serving in a daemon thread, return once the server accepts requests."""
        if self._thread is not None:
            raise RuntimeError("OpenAIServer.start(): already started; stop() it first")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: uvicorn writes a response's head and body separately, and with
        # Nagle's algorithm on, the body waited for the client's delayed ACK (~40 ms on every response).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level=self.log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=5
        )
        self._server = uvicorn.Server(config)
        self.app.state.service.runner.start(drive=self.drive_batches)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name=f"openai-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"OpenAIServer did not start on {self.url} within {timeout_s}s; see the log above"
                )
            time.sleep(0.01)
        if self.recorder is not None:
            self.recorder.bind(self.url, self.api_key)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for its thread (open connections get ``timeout_s``)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True  # type: ignore[union-attr]
                self._thread.join(timeout_s)
        if self._server is not None:
            self.app.state.service.runner.close()
        self._server, self._thread = None, None

    def client(self, **kwargs: Any):
        """An ``openai.OpenAI`` for the plain ``/v1`` routes (retries off, as in ``RecordingSession.client``)."""
        import openai

        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY", **kwargs)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

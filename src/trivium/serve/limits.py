"""Resource limits of the endpoint: what one request may ask, how long it may take, and fair turns.

Design decisions (each limit answers a measured failure; see docs/serve.md for the figures):
- The body is limited while it is read, before anything parses it (``BodyLimit``, an ASGI middleware): a
  declared ``Content-Length`` over ``max_body_bytes`` is answered 413 without parsing a byte (the rest is
  read and dropped first, up to 1 GiB within ``body_timeout_s``, so that a client writing its whole body
  gets the 413, not a reset connection), a chunked body is cut off at the limit, and a body that trickles in
  slower than ``body_timeout_s`` is answered 408.
  A body that is not UTF-8, or JSON nested deeper than ``max_json_depth``, is answered 400 before
  ``json.loads`` (deep tool schemas ended in a RecursionError and a 500 with half a megabyte of traceback).
- Fair turns (``FairGate``): generation happens in *turns* of at most ``split_n`` samples. A request for
  more is split, and each turn waits in one FIFO queue with every other request's turns, so a request for
  ``n=64`` takes turns with the small requests instead of holding the engine for its whole duration. At
  most ``max_concurrent`` turns generate at once (a batching model merges them into one engine batch; a
  bare engine runs one at a time). A turn that waits longer than ``queue_timeout_s`` gives up: 503 with
  ``Retry-After``, and a request still running after ``request_timeout_s`` stops at its next turn (504).
  A turn already generating is never interrupted: the engine has no way to stop a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trivium.jsontext import text_depth

__all__ = ["BodyLimit", "FairGate", "ServeLimits", "ServerBusy"]


@dataclass(frozen=True)
class ServeLimits:
    """The endpoint's limits; defaults are ``ServeConfig``'s (``config/schema.py`` documents each)."""

    max_body_bytes: int = 4 << 20
    max_json_depth: int = 64
    body_timeout_s: float = 30.0
    max_n: int = 128
    split_n: int = 8
    max_tokens: int | None = None  # None: the model's context
    max_concurrent: int = 64
    queue_timeout_s: float = 60.0
    request_timeout_s: float = 600.0

    @classmethod
    def from_config(cls, serve: Any) -> ServeLimits:
        """The limits of a ``ServeConfig`` section."""
        return cls(**{f: getattr(serve, f) for f in cls.__dataclass_fields__ if hasattr(serve, f)})


class ServerBusy(RuntimeError):
    """A turn waited longer than the queue allows."""


class FairGate:
    """FIFO turns with at most ``slots`` holders at a time (see the module docstring)."""

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"FairGate(slots={slots}): need at least one slot")
        self.slots = slots
        self._cv = threading.Condition()
        self._queue: deque[object] = deque()
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @contextlib.contextmanager
    def turn(self, timeout_s: float) -> Iterator[None]:
        """Hold a slot for the body of the ``with``; waits behind earlier turns; ``ServerBusy`` after
        ``timeout_s`` seconds in the queue."""
        ticket = object()
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._queue.append(ticket)
            while self._queue[0] is not ticket or self._running >= self.slots:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._queue.remove(ticket)
                    self._cv.notify_all()
                    raise ServerBusy(f"waited {timeout_s:g} s for a turn")
                self._cv.wait(remaining)
            self._queue.popleft()
            self._running += 1
            self._cv.notify_all()  # the next in line may have a free slot too
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                self._cv.notify_all()


DRAIN_BYTES = 1 << 30  # a refused body is read and dropped up to this much, so the client sees the 413


class BodyLimit:
    """ASGI middleware: request bodies limited in size, time and JSON nesting (see the module docstring)."""

    def __init__(self, app: Any, limits: ServeLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            await self._drain(receive)
            await _refuse(send, 413, self._too_large(int(declared)))
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.limits.body_timeout_s)
        except asyncio.TimeoutError:
            message = f"the request body did not arrive within {self.limits.body_timeout_s:g} s (serve.body_timeout_s)"
            await _refuse(send, 408, message)
            return
        except _TooLarge as exc:
            await self._drain(receive)
            await _refuse(send, 413, self._too_large(exc.size))
            return
        if body is None:  # the client went away
            return
        problem = self._body_problem(body)
        if problem:
            await _refuse(send, 400, problem)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _drain(self, receive: Any) -> None:
        """Read and drop the rest of a refused body (up to ``DRAIN_BYTES``, within ``body_timeout_s``) before
        the 413 is sent: a socket closed with unread bytes is reset by the kernel, and a plain client that
        writes its whole body before reading (urllib, curl) got ECONNRESET instead of the 413. The server
        cannot read after its response (the ASGI server closes then), so it reads first."""

        async def drain() -> None:
            drained = 0
            while drained < DRAIN_BYTES:
                message = await receive()
                drained += len(message.get("body", b""))
                if message["type"] == "http.disconnect" or not message.get("more_body", False):
                    return

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(drain(), self.limits.body_timeout_s)

    async def _read(self, receive: Any) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise _TooLarge(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _body_problem(self, body: bytes) -> str:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"the request body is not UTF-8 (byte {body[exc.start]:#04x} at offset {exc.start}); send JSON"
        limit = self.limits.max_json_depth
        if body.count(b"[") + body.count(b"{") <= limit:
            return ""
        depth = text_depth(text, limit)
        if depth <= limit:
            return ""
        return f"the request body nests JSON {depth} levels deep; at most {limit} are accepted (e.g. tool schemas)"

    def _too_large(self, size: int) -> str:
        return (
            f"the request body has {'at least ' if size > self.limits.max_body_bytes else ''}{size} bytes; at "
            f"most {self.limits.max_body_bytes} are accepted (serve.max_body_bytes): send a shorter request"
        )


class _TooLarge(Exception):
    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI ``receive`` that hands the app the body already read, then the connection's own messages
    (a disconnect, when the client leaves)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Any, status: int, message: str) -> None:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status in (408, 413):
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

"""Faults on purpose, to show that runs survive them: crash points and a seeded fault-injection switch.

**Crash points** (the resume tests): ``TRIVIUM_KILL_AT=point:step`` SIGKILLs the process there. Points:
``explore`` (a step's experiences sampled, not yet trained), ``train`` (trained, not yet checkpointed),
``checkpoint`` (inside the checkpoint write, before it is renamed into place), and ``rank{r}:train``
(trainer rank r > 0 of a multi-rank stage, before it joins step ``step``). Unset, a check costs one
dictionary lookup. Kills at random moments come from outside (the tests send SIGKILL at a seeded time).

**Fault injection** (config section ``faults``, off by default; docs/faults.md): at the real call sites a
seeded draw decides whether a call raises ``InjectedFault`` or hangs, at the configured rates:

| site | where | a fault |
| --- | --- | --- |
| ``workflow`` | the explorer, before each attempt of a task's workflow | raises, or hangs past ``explorer.workflow_timeout_s`` |
| ``env`` | every ``reset`` and ``step`` of an environment (multi-turn workflows) | raises, or hangs past ``env_timeout_s`` |
| ``reward`` | every reward function call (``rewards/registry.py``) | raises (scored 0: rewards/guard.py) |

The explorer opens a ``scope`` per workflow attempt, keyed by the explore step, the task's place and id
and the attempt; a draw hashes (seed, key, site, n-th call of that site in the attempt), so a run injects
the same faults however its threads interleave, and a resumed run injects what the uninterrupted one did.
Outside a scope (evaluation, unless ``faults.in_eval``) nothing is injected. An injected failure travels
the way a real one does (task or episode failed, retried, written to ``failures.jsonl``); the explorer
counts injections per step in ``faults/{site}_{kind}``. A hang sleeps in short slices, so a thread that is
told to stop (``envs/calls.py``) does stop; it lasts ``faults.hang_s``, or 1.5 x the timeout that should
end it.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["FaultInjector", "FaultRates", "InjectedFault", "at", "maybe_die", "wrap"]

SITES = {"workflow": ("raise", "hang"), "env": ("raise", "hang"), "reward": ("raise",)}


def maybe_die(point: str, step: int) -> None:
    target = os.environ.get("TRIVIUM_KILL_AT")
    if target and target == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


class InjectedFault(RuntimeError):
    """A failure injected by the ``faults`` config section (not a bug of the part it names)."""


@dataclass(frozen=True)
class FaultRates:
    """Per-call probabilities of each fault (``faults`` config section; see ``config/schema.py``)."""

    seed: int = 0
    workflow_raise: float = 0.0
    workflow_hang: float = 0.0
    env_raise: float = 0.0
    env_hang: float = 0.0
    reward_raise: float = 0.0
    hang_s: float = 0.0  # 0: 1.5 x the timeout that should end the hang
    in_eval: bool = False

    @classmethod
    def from_config(cls, section: Any) -> FaultRates | None:
        """The rates of a ``FaultsConfig`` (or any object with these attributes); None when all are 0."""
        rates = cls(**{f.name: getattr(section, f.name) for f in fields(cls)})
        return rates if rates.any() else None

    def any(self) -> bool:
        return any(getattr(self, f"{site}_{kind}") > 0 for site, kinds in SITES.items() for kind in kinds)


class FaultInjector:
    """Draws and counts the faults of one explorer (thread-safe)."""

    def __init__(self, rates: FaultRates):
        self.rates = rates
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    @contextlib.contextmanager
    def scope(self, key: str) -> Iterator[_Scope]:
        """Faults may be injected in this thread (and in the calls it wraps) until the block ends."""
        scope = _Scope(self, key)
        token = _SCOPE.set(scope)
        try:
            yield scope
        finally:
            _SCOPE.reset(token)

    def take_counts(self, prefix: str = "faults") -> dict[str, float]:
        """Injections since the last call, as metrics ``{prefix}/{site}_{kind}`` (every kind, zeros too)."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return {f"{prefix}/{s}_{k}": float(counts[f"{s}_{k}"]) for s, kinds in SITES.items() for k in kinds}

    def draw(self, key: str, site: str, index: int) -> str | None:
        """``"raise"``, ``"hang"`` or None for the ``index``-th call of ``site`` under ``key``."""
        digest = hashlib.blake2b(f"{self.rates.seed}|{key}|{site}|{index}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2**64  # uniform in [0, 1)
        for kind in SITES[site]:
            p = getattr(self.rates, f"{site}_{kind}")
            if u < p:
                with self._lock:
                    self._counts[f"{site}_{kind}"] += 1
                return kind
            u -= p
        return None

    def hang_seconds(self, limit_s: float | None) -> float | None:
        """How long an injected hang lasts: ``hang_s``, else 1.5 x ``limit_s``; None: until stopped."""
        if self.rates.hang_s > 0:
            return self.rates.hang_s
        return 1.5 * limit_s if limit_s else None


@dataclass
class _Scope:
    injector: FaultInjector
    key: str
    calls: Counter[str] = field(default_factory=Counter)
    injected: list[str] = field(default_factory=list)  # "{site}_{kind}" of each fault injected here

    def decide(self, site: str) -> str | None:
        index = self.calls[site]
        self.calls[site] += 1
        kind = self.injector.draw(self.key, site, index)
        if kind is not None:
            self.injected.append(f"{site}_{kind}")
        return kind


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("trivium_fault_scope", default=None)


def at(site: str, what: str = "", limit_s: float | None = None) -> None:
    """A call site: raise ``InjectedFault`` or hang here when the draw says so (nothing outside a scope)."""
    scope = _SCOPE.get()
    if scope is not None:
        _act(scope, scope.decide(site), site, what, limit_s)


def wrap(
    site: str, fn: Callable[..., Any], what: str = "", limit_s: float | None = None
) -> Callable[..., Any]:
    """``fn``, or ``fn`` preceded by the drawn fault: drawn here (the scope's thread), injected where the
    returned function runs (e.g. the helper thread that runs an environment call with a timeout)."""
    scope = _SCOPE.get()
    kind = None if scope is None else scope.decide(site)
    if kind is None:
        return fn

    def faulty(*args: Any, **kwargs: Any) -> Any:
        _act(scope, kind, site, what, limit_s)
        return fn(*args, **kwargs)

    faulty.injected = f"{site}_{kind}"  # type: ignore[attr-defined]
    return faulty


def current_injected() -> list[str]:
    """The faults injected so far in this thread's scope (empty outside one)."""
    scope = _SCOPE.get()
    return [] if scope is None else list(scope.injected)


def _act(scope: _Scope, kind: str | None, site: str, what: str, limit_s: float | None) -> None:
    if kind is None:
        return
    where = f"{site} {what}".strip()
    rate = getattr(scope.injector.rates, f"{site}_{kind}")
    if kind == "raise":
        raise InjectedFault(f"injected {site}_{kind} at {where} (faults.{site}_{kind}={rate})")
    _hang(scope.injector.hang_seconds(limit_s))


def _hang(seconds: float | None) -> None:
    """Sleep ``seconds`` (None: for ever) in 50 ms slices: an exception sent to this thread stops it."""
    end = None if seconds is None else time.monotonic() + seconds
    while end is None or time.monotonic() < end:
        time.sleep(0.05 if end is None else min(0.05, max(0.0, end - time.monotonic())))

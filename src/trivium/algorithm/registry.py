"""One registry per algorithm seam: a plain ``name -> function`` dict filled by a decorator.

Design decisions:
- One signature per registry; callers never branch on a part's name.
- A miss is a configuration error, so it lists every valid name and the nearest one.
- A name ``"my_pkg.my_module:my_fn"`` imports the user's own function, so a YAML file can plug in a part
  that lives outside this package without registering it anywhere.
- Registries are import-time constants; ``Registry.snapshot()`` lets a test register and then restore.

Left out on purpose: directory scanning, lazy string maps and entry points (one lookup mechanism).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = [
    "ADVANTAGE_FNS",
    "AGGREGATIONS",
    "KL_FNS",
    "POLICY_LOSS_FNS",
    "Registry",
    "UnknownPartError",
]

F = TypeVar("F", bound=Callable[..., Any])


class UnknownPartError(KeyError):
    """A name that is neither registered nor an importable ``"module:attr"`` path."""

    def __str__(self) -> str:  # KeyError would print the message quoted, with escaped newlines
        return str(self.args[0])


class Registry:
    """Parts of one seam (e.g. ``"policy loss"``), looked up by name."""

    def __init__(self, seam: str) -> None:
        self.seam = seam
        self._parts: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        if ":" in name:
            raise ValueError(f"{self.seam} name {name!r} must not contain ':' (reserved for 'module:attr')")

        def add(fn: F) -> F:
            if name in self._parts:
                raise ValueError(
                    f"{self.seam} {name!r} is already registered (by {self._parts[name].__qualname__}); "
                    f"choose another name"
                )
            self._parts[name] = fn
            return fn

        return add

    def get(self, name: str) -> Callable[..., Any]:
        if name in self._parts:
            return self._parts[name]
        if ":" in name:
            return self._import(name)
        near = difflib.get_close_matches(name, self._parts, n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise UnknownPartError(
            f"Unknown {self.seam} {name!r}.{hint} Valid names: {', '.join(self.names())}; "
            f"or give your own function as 'package.module:function'."
        )

    def names(self) -> list[str]:
        return sorted(self._parts)

    def __contains__(self, name: object) -> bool:
        return name in self._parts

    def check_args(self, name: str, args: Mapping[str, Any]) -> None:
        """Raise ``TypeError`` naming unknown keys of ``args`` (the parameters after the first).

        Called before training starts so that a typo in a config fails with the list of valid keys, not
        with Python's "unexpected keyword argument" deep inside a step.
        """
        params = list(inspect.signature(self.get(name)).parameters.values())[1:]
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return
        valid = sorted(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        unknown = sorted(set(args) - set(valid))
        if unknown:
            raise TypeError(
                f"{self.seam} {name!r} got unknown args {unknown}; valid args: {', '.join(valid) or 'none'}"
            )

    @contextmanager
    def snapshot(self) -> Iterator[Registry]:
        """Restore the registered parts on exit (tests that register must not leak into other tests)."""
        saved = dict(self._parts)
        try:
            yield self
        finally:
            self._parts.clear()
            self._parts.update(saved)

    def _import(self, path: str) -> Callable[..., Any]:
        module_name, _, attr = path.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as err:
            raise UnknownPartError(
                f"{self.seam} {path!r}: cannot import module {module_name!r} ({err})"
            ) from err
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError as err:
            raise UnknownPartError(
                f"{self.seam} {path!r}: module {module_name!r} has no attribute {attr!r}"
            ) from err
        if not callable(obj):
            raise UnknownPartError(f"{self.seam} {path!r} is a {type(obj).__name__}, not a function")
        return obj


ADVANTAGE_FNS = Registry("advantage fn")  # fn(AdvantageInputs, **args) -> (advantages [R, L], metrics)
POLICY_LOSS_FNS = Registry("policy loss")  # fn(PolicyLossInputs, **args) -> (per-token loss [R, L], metrics)
KL_FNS = Registry("KL estimator")  # fn(logprobs [R, L], ref_logprobs [R, L]) -> per-token KL [R, L]
AGGREGATIONS = Registry("aggregation")  # fn(mask [R, L], seq_index [R, L], LossScale) -> weights [R, L]

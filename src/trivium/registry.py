"""The one lookup mechanism of every seam: a registry of named parts, and ``module:attr`` for the user's own.

Every place where a config names a piece of code goes through a ``Registry``: workflows, rewards,
environments, tools, agents, algorithm presets and their parts (advantage, policy loss, KL estimator,
aggregation), sample strategies, weight-sync methods. A name is either

- a registered name (``"math_verify"``): built-in parts register when their module is imported, which the
  registry does on its first use (``builtins``: the module defining a registry never imports the modules
  that fill it, so the two make no import circle), and a user's module registers its own parts when the
  config lists it under ``plugins: [my_pkg.my_mod]``; or
- ``"package.module:attr"``: imported on first use, with no registration at all (``attr`` may be dotted,
  ``module:Class.method``).

Design decisions:
- One signature per registry (stated in ``doc``), and callers never branch on a part's name.
- A miss is a configuration error: it lists every valid name and the nearest one.
- ``module:attr`` is refused for modules of Python's standard library (``os:system`` is not a reward
  function): plugins are the user's own code. Anything else the user names is imported and runs with the
  user's rights, exactly as if their config were a Python script; do not run configs you do not trust.
- An imported object must be of the seam's kind (``check``: a class of the right base, a callable), so a
  typo fails at ``check-config`` with the reason, not deep inside a step.
- Registries are import-time constants; ``Registry.snapshot()`` lets a test register and then restore.

Left out on purpose: directory scanning, entry points and lazy string maps (one lookup mechanism).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = [
    "Registry",
    "UnknownPartError",
    "add_import_paths",
    "import_object",
    "import_plugin",
    "is_import_path",
    "part_args",
]

T = TypeVar("T")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_DENIED = frozenset(sys.stdlib_module_names) | {"builtins", "__main__"}


class UnknownPartError(KeyError):
    """A name that is neither registered nor an importable ``"module:attr"`` path of the right kind.

    ``rule`` says what is wrong, ``fix`` what to do (config validation shows them apart)."""

    def __init__(self, rule: str, fix: str = "") -> None:
        super().__init__(f"{rule}. {fix}" if fix else rule)
        self.rule, self.fix = rule, fix

    def __str__(self) -> str:  # KeyError would print the message quoted, with escaped newlines
        return str(self.args[0])


def is_import_path(name: str) -> bool:
    return ":" in name


def import_object(path: str, what: str = "part") -> Any:
    """The object at ``"package.module:attr"``; ``UnknownPartError`` saying what is wrong otherwise."""
    if not _PATH.fullmatch(path):
        raise UnknownPartError(
            f"{what} {path!r} is not a valid import path",
            "write 'package.module:name' (an absolute module, no leading dot, one ':' before the attribute)",
        )
    module_name, _, attr = path.partition(":")
    if module_name.split(".")[0] in _DENIED:
        raise UnknownPartError(
            f"{what} {path!r}: parts are not taken from Python's standard library ({module_name!r})",
            "name a function or class of your own module",
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as err:  # a user's module may fail to import in any way: report it, do not crash
        raise UnknownPartError(
            f"{what} {path!r}: cannot import module {module_name!r} ({type(err).__name__}: {err})",
            "put the module in the config file's folder or the working directory, or on PYTHONPATH",
        ) from err
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as err:
        raise UnknownPartError(
            f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}", "check the name after ':'"
        ) from err
    return obj


def add_import_paths(*folders: str | Path) -> None:
    """Put ``folders`` (the config file's folder, the working directory) on the import path, so that a
    config's plugins and ``module:attr`` names find the user's modules next to it. ``trivium`` is a console
    script: Python does not put the working directory there by itself."""
    for folder in folders:
        path = str(Path(folder).resolve())
        if path not in sys.path:
            sys.path.append(path)


def import_plugin(module_name: str, probe: bool = False) -> None:
    """Import a module listed under ``plugins:`` (it registers its parts); ``UnknownPartError`` otherwise.

    ``probe``: import it in a child Python first when this process has not imported it yet, so that a
    module that ends the process on import (``os._exit``, a crash of a C extension) is reported instead of
    ending check-config with no message, a run with rc 0, or Studio. Rank processes do not probe: their
    launcher did."""
    if not isinstance(module_name, str) or not _MODULE.fullmatch(module_name):
        raise UnknownPartError(
            f"plugin {module_name!r} is not a module name",
            "write an absolute module path, e.g. my_pkg.my_parts",
        )
    if module_name.split(".")[0] in _DENIED:
        raise UnknownPartError(
            f"plugin {module_name!r} is a module of Python's standard library", "list your own modules"
        )
    if probe and module_name not in sys.modules and importlib.util.find_spec(module_name.split(".")[0]):
        _probe_import(module_name)  # (a module that is not there is reported by the import below)
    try:
        importlib.import_module(module_name)
    except SystemExit as err:  # sys.exit() on import must not end check-config (or Studio) silently
        raise UnknownPartError(
            f"plugin {module_name!r} called sys.exit({err.code!r}) while it was imported",
            "a plugin module only registers parts when imported: move the code that exits under "
            "`if __name__ == '__main__':`",
        ) from err
    except Exception as err:  # a user's module may fail in any way: report it with its reason
        raise UnknownPartError(
            f"plugin {module_name!r} cannot be imported ({type(err).__name__}: {err})",
            "put the module in the config file's folder or the working directory, or on PYTHONPATH, and fix "
            "the error it raises on import",
        ) from err


PROBE_TIMEOUT_S = 120


def _probe_import(module_name: str) -> None:
    """Import ``module_name`` in a child Python with this process's import path and folder; raise
    ``UnknownPartError`` when the child ended (or hung) before the import returned. An exception or
    ``sys.exit`` is left to the real import, which reports it with its reason."""
    import os
    import secrets
    import signal
    import subprocess

    done = f"trivium-probe-{secrets.token_hex(8)}"
    code = (
        "import importlib, os, sys\n"
        "try:\n    importlib.import_module(sys.argv[1])\nexcept BaseException:\n    pass\n"
        "sys.stdout.write('\\n' + sys.argv[2] + '\\n')\nsys.stdout.flush()\nos._exit(0)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    fix = (
        "a plugin module only registers parts when imported: move what ends the process (os._exit(), "
        "a blocking call, a crashing extension) under `if __name__ == '__main__':`"
    )
    try:
        child = subprocess.run(
            [sys.executable, "-c", code, module_name, done],
            capture_output=True,
            text=True,
            errors="replace",
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as err:
        if done in str(err.stdout or ""):
            return  # imported; only the child's exit hung
        raise UnknownPartError(
            f"plugin {module_name!r} did not finish importing within {PROBE_TIMEOUT_S} s", fix
        ) from None
    if done in child.stdout.splitlines():
        return
    code_said = f"signal {signal.Signals(-child.returncode).name}" if child.returncode < 0 else None
    last = (child.stderr.strip().splitlines() or [""])[-1][:300]
    raise UnknownPartError(
        f"plugin {module_name!r} ended the Python process while it was imported "
        f"({code_said or f'exit code {child.returncode}'}{'; it said: ' + last if last else ''})",
        fix,
    )


def callable_part(obj: Any) -> str | None:
    """``check`` for seams of functions: the reason ``obj`` is not one, or None."""
    return (
        None if callable(obj) and not inspect.isclass(obj) else f"is a {type(obj).__name__}, not a function"
    )


def subclass_of(base: type) -> Callable[[Any], str | None]:
    """``check`` for seams of classes: the object must be a subclass of ``base``."""

    def check(obj: Any) -> str | None:
        if inspect.isclass(obj) and issubclass(obj, base):
            return None
        return f"is {obj!r}, not a subclass of {base.__module__}.{base.__qualname__}"

    return check


def instance_of(kind: type) -> Callable[[Any], str | None]:
    """``check`` for seams of values (presets, tools): the object must be an instance of ``kind``."""

    def check(obj: Any) -> str | None:
        return None if isinstance(obj, kind) else f"is a {type(obj).__name__}, not a {kind.__name__}"

    return check


def part_args(part: Callable[..., Any], skip: int) -> list[str] | None:
    """The config args ``part`` takes: its named parameters after the first ``skip`` (the seam's inputs),
    plus, when it collects more in ``**kwargs``, the names its ``more_args`` attribute lists (the judges
    take their shared settings that way, ``rewards/judge.py``). None: ``**kwargs`` with no list, any key.
    """
    params = list(inspect.signature(part).parameters.values())[skip:]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        more = getattr(part, "more_args", None)
        if more is None:
            return None
        names += list(more)
    return sorted(names)


class Registry(Generic[T]):
    """Parts of one seam (e.g. ``"policy loss"``), looked up by name or ``module:attr``.

    ``doc`` states the signature every part must have (shown in errors); ``check(obj)`` returns why an
    object cannot be a part of this seam, or None (default: it must be callable). ``inputs``: how many
    leading parameters are the seam's inputs; the parameters after them are the part's config ``args``.
    ``builtins``: the modules whose import registers the built-in parts, imported on the registry's first
    use (a lookup, a listing, a registration), so that the module defining the registry never imports
    the modules that fill it (no import circle) and a heavy built-in costs nothing until it is asked for.
    """

    def __init__(
        self,
        seam: str,
        *,
        doc: str = "",
        check: Callable[[Any], str | None] | None = None,
        inputs: int = 1,
        builtins: Sequence[str] = (),
    ) -> None:
        self.seam = seam
        self.doc = doc
        self.inputs = inputs
        self._check = check or (
            lambda obj: None if callable(obj) else f"is a {type(obj).__name__}, not callable"
        )
        self._parts: dict[str, T] = {}
        self._builtins = tuple(builtins)
        self._builtins_state = "absent" if self._builtins else "loaded"  # absent | loading | loaded
        self._builtins_lock = threading.RLock()

    def _load_builtins(self) -> None:
        """Import ``builtins`` once. Their parts' registrations do not come back here (a built-in module may
        be half imported when it registers its first part); another thread waits for the first load; a
        failed import leaves them to be tried again."""
        if self._builtins_state == "loaded":
            return
        with self._builtins_lock:
            if self._builtins_state != "absent":
                return
            self._builtins_state = "loading"
            try:
                for module in self._builtins:
                    importlib.import_module(module)
            except BaseException:
                self._builtins_state = "absent"
                raise
            self._builtins_state = "loaded"

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator (or ``registry.register(name)(obj)``) adding ``obj`` under ``name``."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(
                f"{self.seam} name {name!r} must be a non-empty string and must not contain ':' (reserved for 'module:attr')"
            )

        def add(obj: T) -> T:
            if getattr(obj, "__module__", None) not in self._builtins:
                self._load_builtins()  # a user's part that takes a built-in's name is refused now, not later
            if name in self._parts:
                owner = getattr(self._parts[name], "__module__", "?")
                raise ValueError(
                    f"{self.seam} {name!r} is already registered (by {owner}); choose another name"
                )
            reason = self._check(obj)
            if reason:
                raise TypeError(f"{self.seam} {name!r} {reason}" + (f" ({self.doc})" if self.doc else ""))
            self._parts[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        self._load_builtins()
        if not isinstance(name, str):
            raise UnknownPartError(
                f"{self.seam} must be named by a string, got {type(name).__name__} {name!r}", self._valid()
            )
        if name in self._parts:
            return self._parts[name]
        if is_import_path(name):
            obj = import_object(name, self.seam)
            reason = self._check(obj)
            if reason:
                raise UnknownPartError(f"{self.seam} {name!r} {reason}", f"expected {self.doc or 'a part'}")
            return obj
        near = difflib.get_close_matches(name, self._parts, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        if "." in name:
            hint += f"{name!r} looks like a dotted path: write it as 'package.module:name'. "
        raise UnknownPartError(f"unknown {self.seam} {name!r}", hint + self._valid())

    def _valid(self) -> str:
        return (
            f"valid: {', '.join(self.names()) or 'none'}; or your own as 'package.module:name' (or a name "
            "registered by a module listed under plugins:)"
        )

    def problem(self, name: str) -> UnknownPartError | None:
        """Why ``get(name)`` would fail (``.rule``, ``.fix``), or None: for validation, which collects
        problems instead of raising."""
        try:
            self.get(name)
        except UnknownPartError as err:
            return err
        return None

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._parts)

    def items(self) -> list[tuple[str, T]]:
        self._load_builtins()
        return sorted(self._parts.items())

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def check_args(self, name: str, args: Mapping[str, Any]) -> None:
        """Raise ``TypeError`` naming unknown keys of ``args`` (the parameters after the ``inputs``), then
        run the part's own value checks: a callable ``check_args(args)`` attribute that raises ``ValueError``
        (a judge's URL, a regex that does not compile).

        Called before training starts so that a typo in a config fails with the list of valid keys, not
        with Python's "unexpected keyword argument" deep inside a step.
        """
        part = self.get(name)
        valid = part_args(part, self.inputs)
        unknown = [] if valid is None else sorted(set(args) - set(valid))
        if unknown:
            raise TypeError(
                f"{self.seam} {name!r} got unknown args {unknown}; valid args: {', '.join(valid) or 'none'}"
            )
        check = getattr(part, "check_args", None)
        if callable(check):
            check(args)

    @contextmanager
    def snapshot(self) -> Iterator[Registry[T]]:
        """Restore the registered parts on exit (tests that register must not leak into other tests)."""
        self._load_builtins()  # before saving: loaded inside, they would be dropped on exit for good
        saved = dict(self._parts)
        try:
            yield self
        finally:
            self._parts.clear()
            self._parts.update(saved)

"""Run untrusted Python in a subprocess with limits; what stopped it, as one of a few reasons.

``run_python(code, stdin, limits)`` writes ``code`` into a fresh temporary directory (the process's cwd,
deleted afterwards) and runs ``python -I -S`` there with an empty environment (``PATH=/usr/bin:/bin``
only), its own session (process group), no bytecode written (``-B``), and these limits:

What the OS enforces (set in ``preexec_fn`` before ``exec``):
- ``RLIMIT_CPU`` (CPU seconds) and a wall-clock timeout in the parent; on either the whole process group
  is killed (``SIGKILL``), and the group is killed after every run anyway.
- ``RLIMIT_AS`` (address space): a 10 GB allocation fails with ``MemoryError``.
- ``RLIMIT_NPROC`` (processes and threads of the user; default 1: no ``fork``, no thread). Run as root,
  the limit would not apply, so a root parent drops the child to an unused uid/gid of its own
  (``SandboxLimits.uid_base`` + a slot per concurrent run), for which the limit counts only that run; the
  temporary directory is given to that uid, so files elsewhere are the OS's to refuse (other users' files,
  root's folders) -- except world-writable folders such as ``/tmp``, which only the audit hook refuses.
  Not root, the limit counts every process of the user: the sandbox cannot fork at all.
- ``RLIMIT_FSIZE`` (largest file written): a bigger write fails with ``OSError: File too large``.
- No network, where the kernel allows: a new network namespace (``unshare(CLONE_NEWNET)``, with
  ``CLONE_NEWUSER`` when not root) holds only a down loopback; ``network_isolated()`` says whether this
  machine allows it (probed once). Where it does not, only the audit hook stands between the code and
  the network.

What an audit hook enforces (``sys.addaudithook``, installed before the code runs, in the same process):
``socket`` creation, ``connect``, ``bind`` and name lookups are refused; ``open`` for writing, and removing,
renaming or creating files, are refused outside the temporary directory; ``ctypes`` (which could reach
C functions without any audit event) cannot be imported. An audit hook is not a security boundary: it
stops honest mistakes and a policy's accidents, and the OS limits above stop the rest.

Reasons (``SandboxResult.reason``): ``ok``, ``timeout``, ``memory``, ``processes``, ``file_size``,
``denied`` (a refused network or file operation, by the hook or the OS), ``error`` (any other exception or
non-zero exit).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

__all__ = ["SandboxLimits", "SandboxResult", "network_isolated", "run_python"]

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_LIBC = ctypes.CDLL(None, use_errno=True)  # resolved here: the child only calls it
_DENIED = "[sandbox denied]"
_GUARD = r"""
import os
import os.path
import sys
ROOT = {root!r}
MARK = {mark!r}
NO_PROCESSES = {no_processes!r}
SPAWN = ("os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system", "subprocess.Popen",
         "_thread.start_new_thread")
def _inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path)) if not isinstance(path, int) else ROOT
    except Exception:
        return False
    return p == ROOT or p.startswith(ROOT + "/")
def _hook(event, args):
    if event.startswith("socket.") or event in ("ctypes.dlopen", "ctypes.dlsym"):
        raise PermissionError(MARK + " " + event)
    if NO_PROCESSES and event in SPAWN:
        raise BlockingIOError(11, MARK + " no processes: " + event)
    if event == "import" and args[0] in ("ctypes", "_ctypes", "_posixsubprocess"):
        raise PermissionError(MARK + " import " + args[0])
    if event == "open" and args[1] is not None and any(c in str(args[1]) for c in "wax+") and not _inside(args[0]):
        raise PermissionError(MARK + " write " + str(args[0]))
    if event == "open" and isinstance(args[2], int) and args[2] & 0o3 and not _inside(args[0]):
        raise PermissionError(MARK + " write " + str(args[0]))
    if event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                 "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move"):
        if not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
            raise PermissionError(MARK + " " + event + " " + str(args[0]))
sys.addaudithook(_hook)
del _hook
__file__ = "solution.py"
exec(compile(open("solution.py").read(), "solution.py", "exec"), {{"__name__": "__main__"}})
"""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock, per run
    cpu_s: int = 5  # RLIMIT_CPU
    memory_mb: int = 512  # RLIMIT_AS
    max_processes: int = 1  # RLIMIT_NPROC
    max_file_mb: int = 16  # RLIMIT_FSIZE
    max_output_chars: int = 1 << 20  # stdout and stderr beyond this are cut
    uid_base: int = 1_990_000  # root only: run n uses uid/gid uid_base + slot


@dataclass(frozen=True)
class SandboxResult:
    reason: str
    returncode: int | None
    stdout: str
    stderr: str


_slots_lock = threading.Lock()
_slots_free: list[int] = list(range(256))


@functools.cache
def network_isolated() -> bool:
    """Whether a child can get a network namespace of its own here (probed once, with a real child)."""
    try:
        subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_unshare_net, check=True, timeout=30)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


@functools.cache
def sandbox_python(uid_base: int = SandboxLimits.uid_base) -> tuple[str, bool]:
    """The interpreter the sandbox runs, and whether it runs as a uid of its own (else: this process's).

    Not root: ``sys.executable``, as this user. Root: the first of ``sys.executable`` and ``python3`` on
    PATH that an unprivileged uid can run (an interpreter under a private home cannot be); if none can,
    ``sys.executable`` as root, where ``RLIMIT_NPROC`` does not apply and the audit hook refuses every
    process creation instead."""
    if os.geteuid() != 0:
        return sys.executable, False
    system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or ""
    for candidate in dict.fromkeys([sys.executable, system]):
        if not candidate:
            continue
        try:
            subprocess.run(
                [candidate, "-I", "-S", "-c", "pass"],
                preexec_fn=functools.partial(_become, uid_base),
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
                check=True,
                capture_output=True,
                timeout=30,
            )
        except (subprocess.SubprocessError, OSError):
            continue
        return candidate, True
    return sys.executable, False


def _become(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _unshare_net() -> None:
    flags = _CLONE_NEWNET if os.geteuid() == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
    if _LIBC.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")


def _preexec(limits: SandboxLimits, uid: int | None, isolate: bool):
    def setup() -> None:
        if isolate:
            _unshare_net()
        if uid is not None:
            _become(uid)
        mb = 1 << 20
        for which, value in (
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_AS, limits.memory_mb * mb),
            (resource.RLIMIT_NPROC, limits.max_processes),
            (resource.RLIMIT_FSIZE, limits.max_file_mb * mb),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(which, (value, value))

    return setup


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` with ``stdin`` under ``limits`` (module docstring); never raises for what the code does."""
    limits = limits or SandboxLimits()
    python, own_uid = sandbox_python(limits.uid_base)
    root = os.path.realpath(tempfile.mkdtemp(prefix="trivium-sandbox-"))
    slot = _take_slot() if own_uid else None
    uid = None if slot is None else limits.uid_base + slot
    no_processes = os.geteuid() == 0 and not own_uid  # RLIMIT_NPROC cannot hold root: the hook must
    try:
        with open(os.path.join(root, "solution.py"), "w", encoding="utf-8") as f:
            f.write(code)
        with open(os.path.join(root, "_guard.py"), "w", encoding="utf-8") as f:
            f.write(_GUARD.format(root=root, mark=_DENIED, no_processes=no_processes))
        if uid is not None:
            os.chown(root, uid, uid)
            os.chmod(root, 0o700)
        proc = subprocess.Popen(
            [python, "-I", "-S", "-B", "-X", "utf8", "_guard.py"],
            cwd=root,
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_preexec(limits, uid, network_isolated()),
        )
        try:
            out, err = proc.communicate(stdin.encode(), timeout=limits.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            timed_out = True
        _kill_group(proc.pid)
        cut = limits.max_output_chars
        stdout = out[:cut].decode("utf-8", "replace")
        stderr = err[-cut:].decode("utf-8", "replace")
        return SandboxResult(_reason(proc.returncode, stderr, timed_out), proc.returncode, stdout, stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if slot is not None:
            with _slots_lock:
                _slots_free.append(slot)


def _take_slot() -> int:
    with _slots_lock:
        if not _slots_free:
            raise RuntimeError("more than 256 sandboxes at once: lower the reward's concurrency")
        return _slots_free.pop(0)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pgid, signal.SIGKILL)


def _reason(returncode: int | None, stderr: str, timed_out: bool) -> str:
    if timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if returncode == 0:
        return "ok"
    last = stderr.strip().rsplit("\n", 1)[-1]
    if "MemoryError" in last:
        return "memory"
    if "BlockingIOError" in last or "can't start new thread" in last:
        return "processes"
    if "File too large" in last or returncode == -signal.SIGXFSZ:
        return "file_size"
    if _DENIED in stderr or "PermissionError" in last or "Network is unreachable" in last:
        return "denied"
    return "error"

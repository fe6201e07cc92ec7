"""The ``code`` reward runs answers in a sandbox: hostile programs are stopped, scored 0 with the reason
counted, and the caller goes on (the issue's five cases: an infinite loop, a fork bomb, a 10 GB allocation,
a write outside the sandbox's folder, a socket)."""

import os
import time
from pathlib import Path

import pytest

from trivium.rewards import check_reward_args, get_reward_fn
from trivium.rewards.code import REASONS, extract_code
from trivium.rewards.guard import guarded_reward
from trivium.rewards.sandbox import SandboxLimits, run_python, sandbox_python

ADD = {"tests": [{"input": "1 2\n", "output": "3"}, {"input": "40 2\n", "output": "42\n"}]}
FAST = {"timeout_s": 2.0, "memory_mb": 256}
reward = get_reward_fn("code", FAST)


def fenced(code):
    return f"Here is my answer:\n```python\n{code}\n```\n"


def only(reason):
    return {f"count/code_{r}": float(r == reason) for r in REASONS}


def test_a_right_program_passes_every_test_and_a_wrong_one_some():
    right = reward(fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD)
    assert right.reward == 1.0 and right.metrics == {"accuracy": 1.0, "pass_rate": 1.0, **only(None)}
    half = reward(fenced("a, b = map(int, input().split())\nprint(3)"), ADD)  # right on the first test only
    assert half.reward == 0.5 and half.metrics == {"accuracy": 0.0, "pass_rate": 0.5, **only("wrong")}
    strict = get_reward_fn("code", {**FAST, "all_or_nothing": True})
    assert strict(fenced("print(3)"), ADD).reward == 0.0


def test_assert_tests_and_json_text():
    tests = {"tests": '[{"assert": "assert add(2, 3) == 5"}, {"assert": "assert add(-1, 1) == 0"}]'}
    assert reward("def add(a, b):\n    return a + b\n", tests).reward == 1.0
    assert reward("def add(a, b):\n    return a - b\n", tests).metrics["count/code_error"] == 1.0
    exits_early = "import os\nos._exit(0)\ndef add(a, b):\n    return 0\n"  # skips the asserts: no token
    assert reward(exits_early, tests).metrics == {"accuracy": 0.0, "pass_rate": 0.0, **only("wrong")}


HOSTILE = [
    ("while True:\n    pass", "timeout"),
    ("import os\nwhile True:\n    os.fork()", "processes"),
    ("x = bytearray(10 * 1024 ** 3)\nprint(3)", "memory"),
    ("open({outside!r}, 'w').write('escaped')\nprint(3)", "denied"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 9))\nprint(3)", "denied"),
    ("open('big', 'wb').write(b'x' * (32 << 20))\nprint(3)", "file_size"),
]


@pytest.mark.parametrize(("code", "reason"), HOSTILE, ids=[r for _, r in HOSTILE])
def test_hostile_programs_are_stopped_scored_zero_and_counted(code, reason, tmp_path):
    outside = tmp_path / "escaped.txt"
    t0 = time.monotonic()
    result = reward(fenced(code.format(outside=str(outside))), ADD)
    assert result.reward == 0.0 and result.metrics == {"accuracy": 0.0, "pass_rate": 0.0, **only(reason)}
    assert time.monotonic() - t0 < 20  # stopped after the first test: the others are not run
    assert not outside.exists()


def test_the_fork_bomb_leaves_no_process_and_the_caller_goes_on():
    bomb = "import os\nfor _ in range(100):\n    try:\n        os.fork()\n    except OSError:\n        pass\nwhile True:\n    pass"
    result = run_python(bomb, "", SandboxLimits(timeout_s=1.0, cpu_s=1, memory_mb=256))
    assert result.reason == "timeout"  # it swallowed the fork errors and spun: killed with its group
    assert _sandboxed() == []  # no fork survived the group kill
    assert reward(fenced("print(sum(map(int, input().split())))"), ADD).reward == 1.0  # and we go on


def test_a_clean_environment_and_a_fresh_folder():
    os.environ["TRIVIUM_SECRET_FOR_TEST"] = "leak"
    try:
        out = run_python(
            "import os\nprint(sorted(os.environ))\nprint(os.listdir('.'))\nprint(os.getcwd())"
        ).stdout
    finally:
        del os.environ["TRIVIUM_SECRET_FOR_TEST"]
    env, files, cwd = out.splitlines()
    assert "TRIVIUM_SECRET_FOR_TEST" not in env and "PATH" in env
    assert sorted(eval(files)) == ["_guard.py", "solution.py"] and "trivium-sandbox-" in cwd
    assert not Path(cwd).exists()  # removed afterwards


def test_no_code_bad_tests_and_bad_args():
    assert reward("   ", ADD).metrics["count/code_no_code"] == 1.0
    assert extract_code("a\n```\nx = 1\n```\nb\n```py\ny = 2\n```") == "y = 2\n"
    with pytest.raises(ValueError, match="needs the task field 'tests'"):
        reward("print(1)", {"tests": [{"input": 1}]})
    assert guarded_reward("code")("print(1)", {"tests": []}).metrics["count/reward_error"] == 1.0
    with pytest.raises(ValueError, match="memory_mb must be >= 64"):
        check_reward_args("code", {"memory_mb": 8})


def test_the_sandbox_runs_as_a_uid_of_its_own_when_root():
    _, own_uid = sandbox_python()
    out = run_python("import os\nprint(os.getuid())").stdout.strip()
    if os.geteuid() == 0 and own_uid:
        assert int(out) >= SandboxLimits().uid_base  # RLIMIT_NPROC holds for it
    else:
        assert int(out) == os.geteuid()


def _sandboxed():
    """Processes running a sandbox's guard script now (only this test runs sandboxes)."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and b"_guard.py" in (p / "cmdline").read_bytes():
                found.append(int(p.name))
        except OSError:  # it ended meanwhile
            pass
    return found


def _bare(code, *, isolate, uid=None):
    """``code`` under the sandbox's OS limits only (no audit hook): what the kernel alone enforces."""
    import subprocess
    import sys

    from trivium.rewards.sandbox import _preexec

    python, _ = sandbox_python()
    return subprocess.run(
        [python if uid is not None else sys.executable, "-I", "-S", "-c", code],
        preexec_fn=_preexec(SandboxLimits(), uid, isolate),
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )


def test_the_kernel_alone_keeps_the_network_out_where_namespaces_are_allowed():
    import socket

    from trivium.rewards.sandbox import network_isolated

    if not network_isolated():
        pytest.skip("this kernel refuses a network namespace: only the audit hook refuses sockets here")
    server = socket.create_server(("127.0.0.1", 0))
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=5)"
    try:
        assert _bare(code, isolate=False).returncode == 0  # the control: without the namespace it connects
        isolated = _bare(code, isolate=True)
    finally:
        server.close()
    assert isolated.returncode != 0 and "Network is unreachable" in isolated.stderr


def test_the_kernel_alone_refuses_writes_into_root_s_folders_for_the_sandbox_uid(tmp_path):
    _, own_uid = sandbox_python()
    if not own_uid:
        pytest.skip("not root: the sandbox runs as this user, and only the audit hook refuses outside writes")
    target = tmp_path / "escaped.txt"  # tmp_path is root's, mode 0700
    out = _bare(f"open({str(target)!r}, 'w')", isolate=False, uid=SandboxLimits().uid_base + 255)
    assert out.returncode != 0 and "PermissionError" in out.stderr and not target.exists()

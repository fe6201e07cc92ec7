"""``code``: run the answer (Python) against the task's test cases in a sandbox (``rewards/sandbox.py``).

The program is the last fenced code block of the response (```` ```python ... ``` ````, or any fence), else
the whole response. ``data["tests"]`` is a list (or its JSON text) of test cases, each either

- ``{"input": "1 2\\n", "output": "3"}``: the program reads ``input`` on stdin; its stdout must equal
  ``output``, line by line with trailing whitespace ignored (judged here, in the parent process); or
- ``{"assert": "assert add(1, 2) == 3"}``: the code runs after the program, in the same process, and must
  finish (exit 0 and print a per-run token after it). A program that reads its own file can forge that
  token; input/output tests cannot be forged.

Every test is one sandboxed process. Reward: the fraction of tests passed (``all_or_nothing: true``: 1 only
if all pass). After a test stopped for a limit (timeout, memory, processes, file size, a refused
operation), the remaining tests are not run and count as failed.

Metrics: ``accuracy`` (all passed), ``pass_rate``, and ``count/code_<reason>`` (summed per step: how many
answers failed first for that reason): ``no_code``, ``wrong`` (ran, wrong output), ``error`` (an exception
or non-zero exit), ``timeout``, ``memory``, ``processes``, ``file_size``, ``denied``. Keep the task set's
``reward_timeout_s`` above tests x ``timeout_s``: the guard scores an answer 0 when the whole call overruns.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

from trivium.rewards.registry import RewardResult, register_reward
from trivium.rewards.sandbox import SandboxLimits, run_python

__all__ = ["REASONS", "extract_code"]

REASONS = ("no_code", "wrong", "error", "timeout", "memory", "processes", "file_size", "denied")
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str | None:
    """The last fenced block's content, else the stripped response; None when empty."""
    blocks = _FENCE.findall(response)
    code = blocks[-1] if blocks else response
    return code if code.strip() else None


def _tests(data: Mapping[str, Any]) -> list[dict[str, str]]:
    tests = data.get("tests")
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as err:
            raise ValueError(f"the code reward's field 'tests' is text but not JSON ({err})") from None
    ok = isinstance(tests, list) and tests and all(_is_test(t) for t in tests)
    if not ok:
        raise ValueError(
            "the code reward needs the task field 'tests': a non-empty list of {input, output} or {assert} "
            f"objects (or its JSON text), got {tests!r:.80}; map the column with fields: {{tests: <column>}}"
        )
    return tests


def _is_test(t: Any) -> bool:
    if not isinstance(t, dict):
        return False
    io = set(t) == {"input", "output"} and all(isinstance(v, str) for v in t.values())
    return io or (set(t) == {"assert"} and isinstance(t["assert"], str))


def _same_output(got: str, want: str) -> bool:
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(got) == lines(want)


def _run_one(code: str, test: Mapping[str, str], limits: SandboxLimits) -> str:
    if "assert" in test:
        token = secrets.token_hex(16)
        result = run_python(f"{code}\n\n{test['assert']}\nprint({token!r})\n", "", limits)
        if result.reason != "ok":
            return result.reason
        return "ok" if result.stdout.rstrip().endswith(token) else "wrong"
    result = run_python(code, test["input"], limits)
    if result.reason != "ok":
        return result.reason
    return "ok" if _same_output(result.stdout, test["output"]) else "wrong"


def _check(args: Mapping[str, Any]) -> None:
    for key in ("timeout_s", "memory_mb", "max_processes", "max_file_mb"):
        value = args.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"reward_args.{key} must be a positive number, got {value!r}")
    if args.get("memory_mb", 512) < 64:
        raise ValueError("reward_args.memory_mb must be >= 64 (the interpreter alone needs ~30 MB)")


@register_reward("code", check_args=_check)
def code_reward(
    response: str,
    data: Mapping[str, Any],
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_processes: int = 1,
    max_file_mb: int = 16,
    all_or_nothing: bool = False,
) -> RewardResult:
    tests = _tests(data)
    counts = {f"count/code_{r}": 0.0 for r in REASONS}
    code = extract_code(response)
    if code is None:
        counts["count/code_no_code"] = 1.0
        return RewardResult(0.0, {"accuracy": 0.0, "pass_rate": 0.0, **counts})
    limits = SandboxLimits(
        timeout_s=float(timeout_s),
        cpu_s=max(1, int(timeout_s + 0.999)),
        memory_mb=int(memory_mb),
        max_processes=int(max_processes),
        max_file_mb=int(max_file_mb),
    )
    passed, first_failure = 0, None
    for test in tests:
        reason = _run_one(code, test, limits)
        if reason == "ok":
            passed += 1
            continue
        first_failure = first_failure or reason
        if reason not in ("wrong", "error"):
            break  # a limit was hit: the other tests would hit it too
    if first_failure is not None:
        counts[f"count/code_{first_failure}"] = 1.0
    rate = passed / len(tests)
    reward = float(passed == len(tests)) if all_or_nothing else rate
    return RewardResult(reward, {"accuracy": float(passed == len(tests)), "pass_rate": rate, **counts})

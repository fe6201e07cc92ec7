#!/usr/bin/env python3
"""The README as a newcomer runs it: every command block executed as written (issue 17).

    python .ci/readme.py            # from the repository root, after the quickstart (.ci/run calls it so)
    python .ci/readme.py --list     # what each command would do (run / shortened / skipped, and why)

Blocks: each ```bash fence runs as one bash script (so ``&`` and ``wait`` work; ``wait`` waits for each
background command and fails with it), its lines as written unless a rule below says otherwise; each bare
``` fence whose first line starts with ``$ `` is a transcript: the command runs and its output must match
the lines shown (``...`` matches anything within a line). Other fences (diagrams, Python, YAML) are not
commands.

Rules, each with its reason, matched against a command with its comment stripped; anything no rule
matches runs exactly as written. ``tests/test_readme.py`` checks that every rule still matches a README
command, so a rule cannot outlive the command it was written for.

After .ci/run's quickstart, the quickstart's command finds its finished run and returns at once, and
examples/decoupled/ starts from its SFT checkpoint. Shortened runs write under runs/readme-check/, which
this script empties first.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CHECK_ROOT = "runs/readme-check"
BLOCK_TIMEOUT_S = 1800

# (pattern, reason): commands not run here
SKIP = [
    (
        r"^pip install torch\S* --index-url https://download\.pytorch\.org/whl/cu",
        "needs a GPU (the CUDA build)",
    ),
    (r"^python -m build$", ".ci/run's stage 'the wheel in a fresh venv' builds the wheel"),
    (
        r"^pip install dist/trivium-",
        ".ci/run's stage 'the wheel in a fresh venv' installs it into a venv of its own",
    ),
    (
        r"^trivium example quickstart --into my-work$",
        ".ci/run's stage 'the wheel in a fresh venv' copies it into an empty folder from the wheel",
    ),
    (
        r"^pip install ",
        ".ci/run installed with this very line (tests/test_readme.py checks they are the same)",
    ),
    (r"^pytest$", ".ci/run ran the test suite just before"),
    (r"^trivium check-template Qwen/", "needs the network (a model on the Hugging Face hub)"),
]
# (pattern, extra arguments, reason): long runs shortened with --set; their run folders go to CHECK_ROOT
SHORTEN = [
    (
        r"^trivium run --config examples/agents/\w+\.yaml$",
        "--set stages.0.buffer.total_steps=2 --set stages.1.buffer.total_steps=1 "
        "--set stages.1.buffer.batch_size=4 --set buffer.eval_tasksets.0.max_rows=8",
        "800 SFT + 40 GRPO steps take ~10 min each on 2 cores",
    ),
    (
        r"^trivium run --config examples/vision/shapes\.yaml$",
        "--set stages.0.buffer.total_steps=3 --set stages.1.buffer.total_steps=2 "
        "--set stages.1.buffer.batch_size=4 --set buffer.eval_tasksets.0.max_rows=8",
        "300 SFT + 120 GRPO steps take ~4.3 min on 2 cores",
    ),
    (
        r"^trivium run --config examples/vision/frozenlake\.yaml$",
        "--set stages.0.buffer.total_steps=2 --set stages.1.buffer.total_steps=1 "
        "--set stages.1.buffer.batch_size=4 --set buffer.eval_tasksets.0.max_rows=8",
        "800 SFT + 40 GRPO steps take ~21 min on 2 cores",
    ),
    (
        r"^trivium run -c examples/decoupled/grpo\.yaml --set mode=(explore|train)$",
        "--set buffer.total_steps=6 --set explorer.eval_interval=3 --set buffer.eval_tasksets.0.max_rows=32",
        "100 steps take ~4 min on 2 cores",
    ),
]

# (pattern, URL, reason): servers, started in the background, asked for URL until it answers (60 s at most),
# then stopped
SERVERS = [
    (
        r"^trivium studio --root runs --configs examples$",
        "http://127.0.0.1:8420/api/info",
        "a web server: it runs until stopped",
    ),
]


@dataclass
class Command:
    line: str  # as written in the README
    words: list[str]  # shell words, comment and a trailing '&' dropped
    background: bool

    @property
    def text(self) -> str:
        return shlex.join(self.words)


def parse_command(line: str) -> Command | None:
    words = shlex.split(line, comments=True)
    if not words:
        return None
    background = words[-1] == "&"
    return Command(line, words[:-1] if background else words, background)


def blocks(readme: str) -> list[tuple[str, list[str]]]:
    """(kind, lines) of each fence: 'bash' command blocks and '$' transcripts."""
    out, kind, lines = [], None, []
    for raw in readme.splitlines():
        if kind is None and raw.startswith("```"):
            kind, lines = raw[3:].strip() or "plain", []
        elif kind is not None and raw.startswith("```"):
            if kind == "bash":
                out.append(("bash", lines))
            elif kind == "plain" and lines and lines[0].startswith("$ "):
                out.append(("$", lines))
            kind = None
        elif kind is not None:
            lines.append(raw)
    return out


def plan(cmd: Command) -> tuple[str, str, str]:
    """(action, extra arguments, reason): action is 'run', 'shorten', 'serve' or 'skip'."""
    for pattern, reason in SKIP:
        if re.search(pattern, cmd.text):
            return "skip", "", reason
    for pattern, extra, reason in SHORTEN:
        if re.search(pattern, cmd.text):
            return "shorten", f"{extra} --set checkpoint_root={CHECK_ROOT}", reason
    for pattern, url, reason in SERVERS:
        if re.search(pattern, cmd.text):
            return "serve", url, reason
    return "run", "", "as written"


def script_of(lines: list[str]) -> tuple[str, list[tuple[Command, str, str]]]:
    """The bash script that runs a block, and the plan of each of its commands."""
    body = ["set -euo pipefail", "pids=()", "trap 'kill ${pids[@]+\"${pids[@]}\"} 2>/dev/null || true' EXIT"]
    plans = []
    for line in lines:
        cmd = parse_command(line)
        if cmd is None:
            continue
        action, extra, reason = plan(cmd)
        plans.append((cmd, action, reason))
        if action == "skip":
            body.append(f"echo {shlex.quote(f'-- skipped: {cmd.text} ({reason})')}")
            continue
        if action == "serve":  # start it, wait until `extra` (its URL) answers, stop it
            body.append(f"echo {shlex.quote(f'-- $ {cmd.text} (until {extra} answers)')}")
            body.append(f"{cmd.text} & server=$!")
            probe = (
                "import sys, time, urllib.request\n"
                "for _ in range(120):\n"
                "    try:\n"
                f"        urllib.request.urlopen({extra!r}, timeout=2); sys.exit(0)\n"
                "    except OSError:\n"
                "        time.sleep(0.5)\n"
                f"sys.exit('{cmd.text}: nothing answered at {extra} within 60 s')\n"
            )
            body.append(f"python3 -c {shlex.quote(probe)} || {{ kill $server; exit 1; }}")
            body.append("kill $server; wait $server || true")
            continue
        if cmd.words == ["wait"]:  # each background command's exit status, not just the last one's
            body.append('for p in ${pids[@]+"${pids[@]}"}; do wait "$p"; done; pids=()')
            continue
        run = line  # as written; a background or shortened command without its comment
        if action == "shorten" or cmd.background:
            run = cmd.text + (f" {extra}" if extra else "") + (" &" if cmd.background else "")
        body.append(f"echo {shlex.quote('-- $ ' + run)}")
        body.append(run + (" pids+=($!)" if cmd.background else ""))
    return "\n".join(body) + "\n", plans


def run_bash(script: str, timeout: int = BLOCK_TIMEOUT_S) -> tuple[int, str]:
    """Run ``script`` in the repository root in its own process group; (exit status, output)."""
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, out + f"\n[timed out after {timeout} s]"
    return proc.returncode, out


def transcript_matches(expected: list[str], got: list[str]) -> str:
    """'' when each shown line matches the output's line (``...`` matching anything), else what differs."""
    got = [g.rstrip() for g in got if g.strip()]
    expected = [e.rstrip() for e in expected if e.strip()]
    if len(got) != len(expected):
        return f"{len(expected)} lines shown, {len(got)} printed"
    for e, g in zip(expected, got):
        if not re.fullmatch(".*".join(map(re.escape, e.split("..."))), g):
            return f"shown:   {e}\nprinted: {g}"
    return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print what each command would do, run nothing")
    ap.add_argument("--only", default="", help="run only the blocks whose text contains this (a dev aid)")
    args = ap.parse_args()
    found = [(kind, lines) for kind, lines in blocks(README.read_text()) if args.only in "\n".join(lines)]
    if args.list:
        for kind, lines in found:
            for cmd in filter(None, map(parse_command, [lines[0][2:]] if kind == "$" else lines)):
                action, extra, reason = ("transcript", "", "output compared") if kind == "$" else plan(cmd)
                print(f"{action:10} {cmd.text}" + (f"  [{extra}]" if extra else "") + f"  ({reason})")
        return 0
    shutil.rmtree(REPO / CHECK_ROOT, ignore_errors=True)
    failures, summary = [], []
    for kind, lines in found:
        t0 = time.monotonic()
        if kind == "$":
            command = lines[0][2:]
            code, out = run_bash(command)
            why = transcript_matches(lines[1:], out.splitlines())
            summary.append(f"{'ok' if not why else 'FAILED':6} transcript  $ {command}")
            if why:
                failures.append(
                    f"transcript `{command}` differs from the README:\n{why}\n--- printed:\n{out}"
                )
            continue
        script, plans = script_of(lines)
        print(f"== block: {' | '.join(c.text for c, _, _ in plans)}", flush=True)
        code, out = run_bash(script)
        print(out, flush=True)
        seconds = time.monotonic() - t0
        for cmd, action, reason in plans:
            summary.append(
                f"{'FAILED' if code and action != 'skip' else 'ok':6} {action:8} {cmd.text}  ({reason})"
            )
        summary.append(f"{'':6} block exit {code} in {seconds:.0f} s")
        if code:
            failures.append(f"block failed (exit {code}): {' | '.join(c.text for c, _, _ in plans)}")
    print("\n== README commands")
    print("\n".join(summary))
    for f in failures:
        print(f"\n{f}", file=sys.stderr)
    print(f"\nREADME check: {'FAILED' if failures else 'every block passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

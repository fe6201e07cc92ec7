"""Load test of the OpenAI-compatible endpoint on loopback: do small requests stay fast while a client asks
for n=64, is memory bounded, and does nothing answer 5xx?

    python benchmarks/endpoint_load.py                  # ~4.5 min on 2 cores: 20 s + 3 x 60 s phases
    python benchmarks/endpoint_load.py --seconds 10     # a quick look
    python benchmarks/endpoint_load.py --torch-threads 1   # the server's torch on one core, clients on the other

The server runs in its own process, as serve mode builds it: a ``TransformersEngine`` behind a
``BatchingRolloutModel`` (requests within 50 ms share an engine batch), default ``ServeLimits``, on a tiny
model (~1M parameters, made on first use in ``--work``). The clients are asyncio tasks with httpx in this
process, each sending chat requests back to back (one user message, ``max_tokens`` 32, T = 1).

Phases, one after another on the same server:
1. ``1 client``: one small-request client alone (the latency of a request with the server idle).
2. ``32 clients``: 32 small-request clients (the reference: the server busy with its normal traffic).
3. ``32 + n=64, split_n=8``: the same 32 clients plus one more that sends n=64 requests back to back. The
   server splits each into turns of 8 samples that share engine batches with the small requests.
4. ``32 + n=64, not split``: the same, with ``split_n=64`` (the server before issue 13: one n=64 call).
   The server restarts for this phase.

Columns: requests answered; p50 / p95 / p99 latency of the small requests (seconds); p95 relative to
phase 2; latency of the n=64 requests (median); 5xx answers; the server's peak RSS (VmHWM) and RSS at the
end of the phase; the 1-minute load average at the end of the phase, and the CPU seconds that processes
other than the server and the clients used during it (0 on an otherwise idle machine: the figures of a
phase with much more are not clean). Writes ``benchmarks/results/endpoint_load.md``. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
QUESTION = [{"role": "user", "content": "Tom has 12 apples and gets 3 more. How many apples now?"}]
SMALL = {"messages": QUESTION, "max_tokens": 32, "temperature": 1.0}
BIG = {**SMALL, "n": 64}


# ---------------------------------------------------------------------------------------------- server
def serve(model_dir: str, port_file: str, split_n: int, torch_threads: int = 0) -> None:
    """The server process: serve ``model_dir`` until killed; writes its port to ``port_file``."""
    import threading

    import torch

    if torch_threads:
        torch.set_num_threads(torch_threads)
    from trivium.models.batching import BatchingRolloutModel
    from trivium.models.transformers_engine import TransformersEngine
    from trivium.serve.limits import ServeLimits
    from trivium.serve.openai_server import OpenAIServer

    model = BatchingRolloutModel(TransformersEngine.from_pretrained(model_dir, seed=0))
    server = OpenAIServer(model, model_name="tiny", limits=ServeLimits(split_n=split_n), drive_batches=True)
    server.start()
    Path(port_file).write_text(str(server.port))
    threading.Event().wait()


def tiny_model(work: Path) -> Path:
    out = work / "endpoint_load_tiny"
    if not (out / "config.json").exists():
        from trivium.models.tiny import make_tiny
        from trivium.tasks.word_problems import corpus, generate_rows

        make_tiny(out, list(corpus(generate_rows(1000, seed=0))), seed=0)
    return out


class Server:
    """The server subprocess: started, its memory read from /proc, stopped."""

    def __init__(self, model_dir: Path, work: Path, split_n: int, torch_threads: int = 0):
        port_file = work / f"endpoint_load_port_{os.getpid()}"
        port_file.unlink(missing_ok=True)
        code = f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import endpoint_load as e; "
        code += f"e.serve({str(model_dir)!r}, {str(port_file)!r}, {split_n}, {torch_threads})"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        deadline = time.monotonic() + 120
        while not port_file.exists() or not port_file.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server process did not start; see its output above")
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{port_file.read_text()}"
        port_file.unlink()

    def memory_mb(self) -> tuple[float, float]:
        """(peak RSS, RSS) of the server process in MB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text().split("\n")
        kb = {
            line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith(("VmHWM", "VmRSS"))
        }
        return kb["VmHWM"] / 1024, kb["VmRSS"] / 1024

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def busy_seconds(pid: int | None = None) -> float:
    """CPU seconds used so far: by the whole machine (``pid`` None, from /proc/stat) or by one process."""
    hz = os.sysconf("SC_CLK_TCK")
    if pid is None:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return (sum(fields) - fields[3] - fields[4]) / hz  # all but idle and iowait
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / hz  # utime + stime


def foreign_cpu(server_pid: int) -> Callable[[], float]:
    """A function returning the CPU seconds used since now by processes other than this one and the server."""
    start = [busy_seconds(), busy_seconds(server_pid), busy_seconds(os.getpid())]

    def since() -> float:
        now = [busy_seconds(), busy_seconds(server_pid), busy_seconds(os.getpid())]
        return (now[0] - start[0]) - (now[1] - start[1]) - (now[2] - start[2])

    return since


# ---------------------------------------------------------------------------------------------- clients
async def client(http, url: str, body: dict, until: float, out: list) -> None:
    """Send ``body`` back to back until ``until``; append ``(seconds, status)`` of each answer."""
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            reply = await http.post(f"{url}/v1/chat/completions", json=body)
            status = reply.status_code
        except Exception as error:  # a connection error counts as a failure, like a 5xx
            status = f"{type(error).__name__}"
        out.append((time.monotonic() - t0, status))


async def phase(url: str, clients: int, big: bool, seconds: float) -> dict:
    import httpx

    small: list = []
    large: list = []
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await http.post(f"{url}/v1/chat/completions", json=SMALL)  # warm-up
        until = time.monotonic() + seconds
        tasks = [client(http, url, SMALL, until, small) for _ in range(clients)]
        if big:
            tasks.append(client(http, url, BIG, until, large))
        await asyncio.gather(*tasks)
    return {"small": small, "big": large}


def summary(
    name: str, result: dict, memory: tuple[float, float], reference_p95: float | None, foreign: float = 0.0
) -> dict:
    latencies = sorted(t for t, s in result["small"] if s == 200)
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
    statuses = [s for _, s in result["small"] + result["big"]]
    big = [t for t, s in result["big"] if s == 200]
    return {
        "phase": name,
        "requests": len(result["small"]),
        "p50_s": q[49],
        "p95_s": q[94],
        "p99_s": q[98],
        "p95_vs_busy": None if reference_p95 is None else q[94] / reference_p95,
        "n64_median_s": statistics.median(big) if big else None,
        "n64_requests": len(result["big"]),
        "errors_5xx": sum(1 for s in statuses if not isinstance(s, int) or s >= 500),
        "other_non_200": sum(1 for s in statuses if isinstance(s, int) and s != 200 and s < 500),
        "peak_rss_mb": memory[0],
        "rss_mb": memory[1],
        "load_1min": os.getloadavg()[0],
        "other_cpu_s": foreign,
    }


def table(rows: list[dict]) -> str:
    head = (
        "| phase | small requests | p50 s | p95 s | p99 s | p95 / phase-2 p95 | n=64 requests (median s) "
        "| 5xx | server peak RSS MB | RSS at end MB | load avg | CPU s of other processes |"
        "\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        ratio = "-" if r["p95_vs_busy"] is None else f"{r['p95_vs_busy']:.2f}x"
        big = "-" if not r["n64_requests"] else f"{r['n64_requests']} ({r['n64_median_s']:.1f})"
        lines.append(
            f"| {r['phase']} | {r['requests']} | {r['p50_s']:.3f} | {r['p95_s']:.3f} | {r['p99_s']:.3f} | {ratio} "
            f"| {big} | {r['errors_5xx']} | {r['peak_rss_mb']:.0f} | {r['rss_mb']:.0f} | {r['load_1min']:.1f} | {max(0.0, r['other_cpu_s']):.0f} |"
        )
    return "\n".join(lines)


def run(seconds: float, clients: int, work: Path, write: bool = True, torch_threads: int = 0) -> list[dict]:
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    model_dir = tiny_model(work)
    rows: list[dict] = []
    server = Server(model_dir, work, split_n=8, torch_threads=torch_threads)
    try:
        plan = [("1 client", 1, False, min(seconds, 20)), (f"{clients} clients", clients, False, seconds)]
        plan.append((f"{clients} + n=64, split_n=8", clients, True, seconds))
        for name, count, big, duration in plan:
            other = foreign_cpu(server.process.pid)
            result = asyncio.run(phase(server.url, count, big, duration))
            reference = rows[1]["p95_s"] if len(rows) > 1 else None
            rows.append(summary(name, result, server.memory_mb(), reference, other()))
            print(table(rows[-1:]).split("\n")[-1], flush=True)
    finally:
        server.stop()
    server = Server(model_dir, work, split_n=64, torch_threads=torch_threads)
    try:
        other = foreign_cpu(server.process.pid)
        result = asyncio.run(phase(server.url, clients, True, seconds))
        rows.append(
            summary(f"{clients} + n=64, not split", result, server.memory_mb(), rows[1]["p95_s"], other())
        )
    finally:
        server.stop()
    text = table(rows)
    print(text)
    if write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        threads = torch_threads or "torch's default"
        note = f"{seconds:g} s phases, {clients} clients, {os.cpu_count()} CPUs, server torch threads: {threads}, "
        note += f"load average before {load_before:.2f}"
        (RESULTS / "endpoint_load.md").write_text(f"{text}\n\n{note}\n")
        (RESULTS / "endpoint_load.json").write_text(json.dumps(rows, indent=1))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="length of phases 2-4 (phase 1: at most 20)"
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--work", type=Path, default=REPO / "benchmarks" / "workdir")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch threads of the server (0: torch's default, one per core); 1 leaves a core to the clients",
    )
    args = parser.parse_args()
    run(args.seconds, args.clients, args.work, torch_threads=args.torch_threads)


if __name__ == "__main__":
    main()

"""Whole runs under faults: injected workflow failures and hangs, a PostgreSQL server restarted mid-run,
a disk that fills up while a checkpoint is written. Each run completes (or stops with a clear error and
continues on the next start) and trains every good experience exactly once."""

import importlib.util
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from tests.launch.helpers import assert_same_records
from tests.launch.kills import finish, grpo_config, records_in, run_dir, start, write

from trivium.buffer.storage_sql import SqlStorage
from trivium.monitor.metrics import read_metrics

_spec = importlib.util.spec_from_file_location(
    "trivium_pg_server_for_faults", Path(__file__).parents[1] / "buffer" / "pg_server.py"
)
pg_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pg_server)


@pytest.mark.integration
def test_grpo_with_30_percent_raising_and_5_percent_hanging_workflows(
    tmp_path, tiny_model_dir, word_problem_dir
):
    """8 tasks x 4 samples a step for 6 steps; a hang lasts 1.5 x the 1 s workflow timeout."""
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        word_problem_dir,
        "faulty",
        steps=6,
        explorer={"workflow_timeout_s": 1.0, "eval_interval": 0},
        faults={"seed": 1, "workflow_raise": 0.3, "workflow_hang": 0.05},
    )
    cfg["buffer"].update(batch_size=8, eval_tasksets=[])
    cfg["buffer"]["taskset"]["repeat_times"] = 4
    finish(start(write(tmp_path, cfg)))
    folder = run_dir(tmp_path, "faulty")
    steps = [r for r in read_metrics(folder) if "train/loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))
    raised = sum(r["faults/workflow_raise"] for r in steps)
    hung = sum(r["faults/workflow_hang"] for r in steps)
    assert 0.15 * 48 <= raised <= 0.45 * 48 and hung >= 1  # seed 1: both kinds happen
    for r in steps:
        failed = r["faults/workflow_raise"] + r["faults/workflow_hang"]
        assert r["rollout/failed_tasks"] == failed  # no other failure
        assert r["rollout/experiences"] == 4 * (8 - failed)  # every good task's samples ...
        assert r["train/sequences"] == r["rollout/experiences"]  # ... trained, once, in its own step
    failures = [json.loads(x) for x in (folder / "failures.jsonl").read_text().splitlines()]
    assert len(failures) == raised + hung
    assert (
        sum(f["injected"] == ["workflow_raise"] and "InjectedFault" in f["reason"] for f in failures)
        == raised
    )
    assert (
        sum(f["injected"] == ["workflow_hang"] and "workflow_timeout_s" in f["reason"] for f in failures)
        == hung
    )


class RestartablePostgres:
    """A throwaway PostgreSQL server (tests/buffer/pg_server.py's recipe) that can be stopped and started
    again on the same port and data, as an operator restarting it would."""

    def __init__(self):
        self.bin = pg_server.find_bin_dir()
        if self.bin is None:
            pytest.skip("no PostgreSQL binaries (initdb, pg_ctl, postgres); `apt-get install -y postgresql`")
        self.user = pg_server._server_user()
        self.root = Path(tempfile.mkdtemp(prefix="trivium-pg-restart-"))
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.data = self.root / "data"
        init = ("-D", self.data, "-U", pg_server.SUPERUSER, "--auth=trust", "-E", "UTF8", "-N")
        pg_server._run(self.user, self.root, self.bin / "initdb", *init)
        self.port = pg_server._free_port()
        self.options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.start()
        pg_server._create_database(self.port, "faults")
        self.url = f"postgresql+psycopg2://{pg_server.SUPERUSER}@127.0.0.1:{self.port}/faults"

    def start(self):
        log = self.root / "server.log"
        pg_server._run(
            self.user,
            self.root,
            self.bin / "pg_ctl",
            "-D",
            self.data,
            "-l",
            log,
            "-w",
            "-o",
            self.options,
            "start",
        )

    def stop(self, mode="fast"):
        pg_server._run(
            self.user, self.root, self.bin / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop", check=False
        )

    def close(self):
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.mark.integration
def test_a_postgresql_restart_mid_run_costs_a_wait_and_loses_nothing(
    tmp_path, tiny_model_dir, word_problem_dir
):
    """The server goes down for 3 s after the second step and comes back: the run's storage operations
    retry, the run completes with the same records as a run on SQLite, and every experience is consumed
    exactly once."""
    server = RestartablePostgres()
    try:
        steps = 12
        reference = grpo_config(tmp_path, tiny_model_dir, word_problem_dir, "sqlite", steps=steps)
        reference["buffer"]["storage"] = {}
        cfg = grpo_config(tmp_path, tiny_model_dir, word_problem_dir, "postgres", steps=steps)
        cfg["buffer"]["storage"] = {"url": server.url, "table": "restart"}
        ref, proc = start(write(tmp_path, reference)), start(write(tmp_path, cfg))
        progress = run_dir(tmp_path, "postgres") / "metrics.jsonl"
        while records_in(progress) < 2:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        server.stop()
        assert proc.poll() is None, "the run ended before the restart"
        time.sleep(3)
        server.start()
        err = finish(proc)
        finish(ref)
        assert "lost its connection" in err  # an operation met the stopped server and retried
        assert_same_records(
            read_metrics(run_dir(tmp_path, "postgres")), read_metrics(run_dir(tmp_path, "sqlite"))
        )
        with SqlStorage(server.url, table="restart") as buffer:
            assert buffer.count() == buffer.count("consumed") == steps * 2 * 3
            assert buffer.count("ready") == buffer.count("claimed") == 0
    finally:
        server.close()


# ---------------------------------------------------------------------------------------------- disk full
def _disk_usage(folder: Path) -> int:
    """Bytes that ``folder``'s files take in 4 KiB pages (tmpfs allocates whole pages)."""
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in folder.rglob("*") if p.is_file())


def _can_mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir(parents=True, exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if ok.returncode == 0:
        subprocess.run(["umount", str(where)], check=True)
    return ok.returncode == 0


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("how", ["tmpfs", "file-size-limit"])
def test_a_checkpoint_that_does_not_fit_stops_the_run_clearly_and_a_rerun_continues(
    tmp_path, tiny_model_dir, word_problem_dir, how
):
    """tmpfs: the run folder on a real 2.5-checkpoint disk (needs root): step 3's checkpoint hits ENOSPC.
    file-size-limit (anywhere): RLIMIT_FSIZE below a checkpoint file, set on the run resumed at step 2
    (the kernel refuses the write with EFBIG). Either way the run stops naming the checkpoint and the
    cause, the half-written folder is gone, and with room again the same command continues from step 2
    and ends exactly like an uninterrupted run."""
    steps = 4
    ref = grpo_config(tmp_path, tiny_model_dir, word_problem_dir, "roomy", steps=steps)
    finish(start(write(tmp_path, ref)))
    checkpoint = run_dir(tmp_path, "roomy") / "checkpoints" / "main" / f"step_{steps}"
    disk = tmp_path / "disk"
    cfg = grpo_config(
        tmp_path, tiny_model_dir, word_problem_dir, "cramped", steps=steps, checkpoint_root=str(disk)
    )
    path = write(tmp_path, cfg)
    folder = disk / "faults" / "cramped"
    mounted = False
    try:
        if how == "tmpfs":
            if not _can_mount_tmpfs(disk):
                pytest.skip(
                    "mounting a tmpfs needs root (CAP_SYS_ADMIN); the file-size-limit case runs anyway"
                )
            size = int(2.5 * _disk_usage(checkpoint)) + 64 * 1024
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
            mounted = True
            failed = start(path)
        else:
            killed = start(path, env={"TRIVIUM_KILL_AT": "train:3"})
            killed.communicate(timeout=300)
            assert killed.returncode == -9
            limit = max(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file()) // 2
            failed = _start_with_file_size_limit(path, limit)
        _, err = failed.communicate(timeout=300)
        assert failed.returncode == 1, err[-3000:]
        cause = "the disk is full" if how == "tmpfs" else "a file would exceed the file size limit"
        assert f"could not write checkpoint {folder}/checkpoints/main/step_3: {cause}" in err, err[-3000:]
        assert "half-written step_3.tmp was removed" in err and "continues from" in err and "step_2" in err
        assert sorted(p.name for p in (folder / "checkpoints" / "main").iterdir()) == ["step_1", "step_2"]
        if mounted:
            subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # room again
        err = finish(start(path))
        assert "resuming from" in err and "step_2" in err
        assert_same_records(read_metrics(folder), read_metrics(run_dir(tmp_path, "roomy")))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def _start_with_file_size_limit(path: Path, limit: int) -> subprocess.Popen:
    def limit_file_size():  # in the child, before exec; Python ignores SIGXFSZ, so writes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path)],
        env={**os.environ, "TRIVIUM_KILL_AT": ""},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=limit_file_size,
    )


def test_resolved_config_records_the_faults_section(tmp_path):
    """The faults of a run are part of its record (the resolved config), so a faulty run is never
    mistaken for a clean one."""
    from trivium.validation.load import load_config

    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"path": "m"},
                "buffer": {"taskset": {"path": "t.jsonl"}},
                "faults": {"workflow_raise": 0.3},
            }
        )
    )
    cfg = load_config(path, [], check_files=False).stages[0].config
    assert cfg.model_dump(mode="json")["faults"]["workflow_raise"] == 0.3

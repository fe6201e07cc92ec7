"""The stall doctor: after stall_timeout_s without a step record it writes every thread's stack and says
which part waits on what; it never stops the run."""

import contextlib
import threading
import time

import pytest
import yaml

from trivium.buffer.queue import ExperienceQueue, QueueClosed
from trivium.buffer.storage_sql import SqlStorage
from trivium.launch.doctor import StallDoctor, diagnose
from trivium.monitor.metrics import read_metrics


def _in_thread(fn, name, *ends):
    """Run ``fn`` in a thread named ``name``; the exceptions ``ends`` end it quietly."""

    def target():
        with contextlib.suppress(*ends):
            fn()

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    time.sleep(0.3)  # it is waiting now
    return thread


def test_a_trainer_waiting_on_the_queue_and_an_explorer_waiting_on_room_are_named():
    empty, full = ExperienceQueue(capacity=4), ExperienceQueue(capacity=2)
    full.put([object(), object()])

    threads = [
        _in_thread(lambda: empty.get(16), "trainer-like", QueueClosed),
        _in_thread(lambda: full.put([object()] * 3), "explorer", QueueClosed),
    ]
    try:
        lines = diagnose()
    finally:
        empty.close()
        full.close()
        for t in threads:
            t.join(5)
    text = "\n".join(lines)
    assert "waits for 16 experiences from the in-process queue (0 queued; put 0, got 0 so far)" in text
    assert "waits for room for 3 experiences in the in-process queue (2 of 2 taken)" in text


def test_a_reader_of_the_sql_buffer_is_named_with_the_explore_process_s_last_record(tmp_path):
    (tmp_path / "metrics.explore.jsonl").write_text("{}\n")
    storage = SqlStorage(tmp_path / "buffer.sqlite", poll_s=0.05)

    def trainer():
        with pytest.raises(TimeoutError):
            storage.read(16, consumer="trainer", timeout=1.5)

    thread = _in_thread(trainer, "trainer-thread")
    text = "\n".join(diagnose(tmp_path))
    thread.join(5)
    storage.close()
    assert "waits for 16 experiences from the buffer sqlite:///" in text and "consumer trainer" in text
    assert "gives up after 1.5 s" in text
    assert "the explore process last wrote a record" in text and "metrics.explore.jsonl" in text


def test_a_rollout_model_waiting_for_weights_is_named():
    from trivium.sync.memory import MemorySync

    class Engine:
        version = 6

    from trivium.sync.protocol import SyncStopped

    sync = MemorySync(Engine(), verify=False)
    thread = _in_thread(lambda: sync.pull(at_least=7, timeout_s=5), "explorer", SyncStopped)
    text = "\n".join(diagnose())
    sync.close()
    thread.join(5)
    assert "waits for weights version 7 (the rollout model has 6)" in text


def test_the_doctor_reports_once_per_stall_window_with_every_stack(tmp_path):
    progress = tmp_path / "metrics.jsonl"
    q = ExperienceQueue(capacity=1)
    thread = _in_thread(lambda: q.get(5), "waiter", QueueClosed)
    with StallDoctor(tmp_path, 0.5, progress) as doctor:
        time.sleep(1.3)  # one report at 0.5 s, the second at 1.0 s
        n = len(doctor.reports)
        progress.write_text("{}\n")  # a step finished: quiet again
        time.sleep(0.3)
        assert len(doctor.reports) == n
    q.close()
    thread.join(5)
    assert n == 2
    text = doctor.reports[0].read_text()
    assert text.startswith("trivium stall doctor: no step finished for")
    assert "waits for 5 experiences from the in-process queue" in text
    assert "--- thread waiter" in text and "--- thread MainThread" in text and "in get" in text


@pytest.mark.integration
def test_a_run_whose_workflows_hang_gets_a_stall_report_and_still_finishes(
    tmp_path, tiny_model_dir, word_problem_dir
):
    """Every workflow of the first step hangs 5 s (no workflow timeout); the doctor (1.5 s) reports the
    tasks in flight and the injected hang in their threads; the hang ends and the run completes."""
    from trivium.cli import main as cli

    cfg = {
        "project": "doctor",
        "name": "hang",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(tiny_model_dir)},
        "explorer": {"rollout": {"max_tokens": 4}, "eval_at_start": False, "eval_interval": 0},
        "monitor": {"progress_bar": False, "stall_timeout_s": 1.5},
        "faults": {"workflow_hang": 1.0, "hang_s": 5.0},
        "buffer": {
            "batch_size": 2,
            "total_steps": 1,
            "taskset": {"path": str(word_problem_dir / "train.jsonl"), "repeat_times": 2},
        },
    }
    path = tmp_path / "hang.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 0
    run_dir = tmp_path / "runs" / "doctor" / "hang"
    reports = sorted(run_dir.glob("stall_run_*_*.txt"))
    assert reports, "no stall report"
    text = reports[0].read_text()
    assert "2 workflow(s) in flight" in text and "task ids train:" in text
    assert "workflow (2 threads): hangs in an injected fault" in text
    assert "faults.py" in text and "_hang" in text  # the stacks themselves
    (record,) = read_metrics(run_dir)
    assert record["faults/workflow_hang"] == 2 and record["rollout/experiences"] == 4  # no timeout: runs on

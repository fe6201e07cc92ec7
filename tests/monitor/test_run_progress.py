"""Issue 17, item 6: one log line for the whole run (stage k of n, time left), next to each stage's bar."""

import logging

from trivium.monitor.metrics import MetricsWriter, RunProgress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_stage_and_run_time_left_at_the_measured_pace(tmp_path, caplog):
    """Worked numbers: the stage starts at t = 5 s, each step takes 2 s (step s lands at 5 + 2 s), so at
    step 10 the pace is (25 - 5) / 10 = 2 s/step: 10 steps left in the stage = 20 s, plus the 10 steps of
    the next stage at the same pace = 40 s in the run; 25 s elapsed since the run began."""
    clock = Clock()
    progress = RunProgress([("sft", 20), ("grpo", 10)], lines_per_stage=10, clock=clock)
    clock.now = 5.0
    assert (
        progress.start_stage(0) == "run: stage 1/2 sft starts (20 steps); run 0/30 steps done, 0:05 elapsed"
    )
    writer = MetricsWriter(tmp_path, progress=progress)  # the run's writer tells it every record
    with caplog.at_level(logging.INFO, logger="trivium.monitor.metrics"):
        writer.write(
            {"stage": "sft", "step": 0, "global_step": 0, "eval/test/accuracy": 0.1}
        )  # eval at start
        for step in range(1, 21):
            clock.now = 5.0 + 2 * step
            writer.write({"stage": "sft", "step": step, "global_step": step})
    writer.close()
    lines = [r.message for r in caplog.records]
    assert len(lines) == 10  # steps 2, 4, ..., 20
    assert lines[4] == (
        "run: stage 1/2 sft, step 10/20 (run 10/30 steps), 0:25 elapsed, ~0:20 left in the stage, ~0:40 in the run"
    )
    assert lines[-1].endswith("~0:00 left in the stage, ~0:20 in the run")


def test_a_line_about_every_tenth_of_a_stage_and_at_its_end(caplog):
    clock = Clock()
    progress = RunProgress([("a", 25)], clock=clock)  # every ceil(25 / 10) = 3 steps, and step 25
    progress.start_stage(0)
    with caplog.at_level(logging.INFO, logger="trivium.monitor.metrics"):
        due = [s for s in range(1, 26) if progress.on_record({"stage": "a", "step": s})]
    assert due == [3, 6, 9, 12, 15, 18, 21, 24, 25]
    assert len([r for r in caplog.records if "run: stage 1/1 a, step" in r.message]) == len(due)
    # records of another stage, repeated steps and records without a step are not steps of this stage
    assert progress.on_record({"stage": "b", "step": 30}) is None
    assert progress.on_record({"stage": "a", "step": 24}) is None
    assert progress.on_record({"stage": "a"}) is None


def test_a_resumed_stage_measures_from_its_first_new_step():
    """Stage 2 resumes after step 5: its first record here is step 6, 3 s after the stage started, so the
    pace is 3 s/step and 4 steps are left (12 s); the run has done 20 + 6 of 30 steps."""
    clock = Clock()
    progress = RunProgress([("sft", 20), ("grpo", 10)], lines_per_stage=10, clock=clock)
    clock.now = 100.0
    progress.start_stage(1)
    clock.now = 103.0
    line = progress.on_record({"stage": "grpo", "step": 6})
    assert line == (
        "run: stage 2/2 grpo, step 6/10 (run 26/30 steps), 1:43 elapsed, ~0:12 left in the stage, ~0:12 in the run"
    )


def test_stages_without_steps_are_named_not_guessed():
    clock = Clock()
    progress = RunProgress([("grpo", 4), ("bench", None)], clock=clock)
    assert "(no steps)" in progress.start_stage(1)
    progress.start_stage(0)
    clock.now = 3600 + 62.0
    assert progress.on_record({"stage": "grpo", "step": 4}).endswith(
        "1:01:02 elapsed, ~0:00 left in the stage, ~0:00 in the run (not counting bench)"
    )


def test_a_log_line_gets_a_line_of_its_own_under_the_progress_bar(capsys):
    """Issue 27 item 8: in captured output a log line was glued to the end of the bar's line."""
    import logging
    import re
    import sys

    from trivium.monitor.metrics import Progress

    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(console)
    try:
        bar = Progress("sft", 3)
        bar.update({"train/loss": 1.0})
        logging.getLogger("trivium.test").warning("a log line")
        bar.update({"train/loss": 0.5})
        bar.close()
        assert console in root.handlers  # the console's handler is given back when the bar closes
    finally:
        root.removeHandler(console)
    err = capsys.readouterr().err
    assert "a log line" in re.split(r"[\r\n]", err), repr(err)

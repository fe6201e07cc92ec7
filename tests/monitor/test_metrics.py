"""Metrics files: one per process of a decoupled run, records after a checkpoint dropped on resume."""

import json

from trivium.monitor.metrics import MetricsWriter, read_metrics
from trivium.monitor.plot import curve, plot_run


def test_each_role_writes_its_own_file_and_read_metrics_reads_them_all(tmp_path):
    main, train = MetricsWriter(tmp_path), MetricsWriter(tmp_path, role="train")
    assert not list(tmp_path.iterdir())  # nothing is created before the first record
    main.write({"stage": "a", "step": 1, "global_step": 1, "x": 1.0})
    train.write({"stage": "b", "step": 1, "global_step": 1, "loss": float("nan")})
    main.close(), train.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.train.jsonl"]
    records = read_metrics(tmp_path)
    assert [r.get("role") for r in records] == [None, "train"]
    assert records[1]["loss"] == "nan"  # non-finite floats are written as strings, valid JSON


def test_drop_after_keeps_the_records_up_to_the_checkpoint_and_reopens(tmp_path):
    writer = MetricsWriter(tmp_path, role="train")
    for step in range(1, 6):
        writer.write({"stage": "s", "step": step, "global_step": 10 + step})
    assert writer.drop_after(12) == 3
    assert writer.drop_after(12) == 0
    writer.write({"stage": "s", "step": 3, "global_step": 13})  # the resumed process writes step 3 again
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]


def test_curves_never_go_back_even_over_duplicate_records(tmp_path):
    records = [{"stage": "s", "global_step": g, "train/loss": v} for g, v in [(1, 5.0), (2, 4.0), (3, 3.0)]]
    records += [{"stage": "s", "global_step": g, "train/loss": v} for g, v in [(2, 4.5), (3, 3.5), (4, 2.0)]]
    xs, ys = curve(records, "train/loss")
    assert xs == [1, 2, 3, 4] and ys == [5.0, 4.5, 3.5, 2.0]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert plot_run(tmp_path).exists()

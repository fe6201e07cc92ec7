"""A tracker of the tests' own, named ``tests.monitor.recording_tracker:RecordingTracker``: it appends
every call to ``recorded.jsonl`` in the run folder (a real part, as a user's tracker would be)."""

import json

from trivium.monitor.trackers import Tracker


class RecordingTracker(Tracker):
    def __init__(self, context):
        super().__init__(context)
        context.saved.setdefault("opened", 0)
        context.saved["opened"] += 1
        self.path = context.run_dir / context.args.get("file", "recorded.jsonl")

    def _write(self, **call):
        with self.path.open("a") as f:
            f.write(json.dumps(call) + "\n")

    def log_config(self, resolved):
        self._write(call="config", keys=sorted(resolved))

    def log(self, step, scalars):
        self._write(call="log", step=step, scalars=scalars)

    def close(self, failed=False):
        self._write(call="close", failed=failed)


def calls(run_dir, file="recorded.jsonl"):
    return [json.loads(x) for x in (run_dir / file).read_text().splitlines()]

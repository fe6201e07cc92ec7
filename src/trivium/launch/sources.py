"""Where a train step's batch comes from: the one mode-specific part of the train loop.

| source | mode | a step's batch |
| --- | --- | --- |
| ``OnlineSource`` | both | the explorer samples a step (inline, or ahead in a thread), its experiences are taken from the feed |
| ``ExperienceSource`` | train with ``buffer.storage`` | experiences claimed from the storage, written by an explore or serve process |
| ``DatasetSource`` | train (SFT, DPO) | the next rows of the dataset |

Experiences pass through the stage's sample strategy and the staleness bound on the way (``sync.versions``).
Each source says what a checkpoint must record to continue exactly from a step (``resume_state``), restores
it (``load``), and is told when that checkpoint is durable (``checkpointed``: a storage feed commits its
claims only then).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from trivium.faults import maybe_die
from trivium.sync.versions import staleness_filter

log = logging.getLogger(__name__)

__all__ = ["BatchSource", "DatasetSource", "ExperienceSource", "OnlineSource"]


class BatchSource(Protocol):
    def next(self, step: int, trainer_version: int) -> tuple[list, dict[str, Any]]:
        """The batch of train step ``step`` (1-based) and the metrics of getting it."""
        ...

    def load(self, resume: dict[str, Any]) -> None: ...

    def resume_state(self) -> dict[str, Any]: ...

    def checkpointed(self) -> None: ...

    def eval_in_loop(self, step: int) -> bool:
        """Whether the loop evaluates after this step (an explorer thread evaluates on its own)."""
        ...

    def after_step(self, step: int, eval_due: bool) -> None: ...

    def close(self) -> None: ...


class ExperienceSource:
    """Experiences from a feed (the in-process queue or a persistent storage), through the sample
    strategy and the staleness bound."""

    def __init__(self, feed, strategy, *, per_step: int, max_staleness: int | None, staleness_policy: str):
        self.feed = feed
        self.strategy = strategy
        self.per_step = per_step
        self.max_staleness = max_staleness
        self.staleness_policy = staleness_policy

    def next(self, step: int, trainer_version: int, n: int | None = None) -> tuple[list, dict[str, Any]]:
        t0 = time.monotonic()
        want = self.per_step if n is None else n
        taken = self.feed.take(want, step) if want else []  # the experience operators may drop a whole step
        waited = time.monotonic() - t0
        record: dict[str, Any] = {"buffer/wait_seconds": waited, "time/wait": waited}
        experiences, stale = staleness_filter(
            self.strategy(taken, step), trainer_version, self.max_staleness, self.staleness_policy
        )
        record.update(stale)
        return experiences, record

    def load(self, resume: dict[str, Any]) -> None:
        """Claims trained into the checkpoint are committed; those of a killed process go back."""
        returned = self.feed.resume(resume.get("claims", []))
        if returned:
            log.info("returned %d experiences claimed after the checkpoint to the buffer", returned)

    def resume_state(self) -> dict[str, Any]:
        return {"claims": self.feed.open_claims()}

    def checkpointed(self) -> None:
        self.feed.checkpointed()

    def eval_in_loop(self, step: int) -> bool:
        return True

    def after_step(self, step: int, eval_due: bool) -> None:
        self.feed.trained()  # a replay policy may serve this step's batch again from the next step

    def close(self) -> None:
        self.feed.close()


class OnlineSource:
    """Mode both: explore a step, then take its experiences. With an ``ExplorerThread`` (``sync_offset``
    > 0) the explorer runs ahead and evaluates between its steps; otherwise it runs inline."""

    def __init__(self, explorer, experiences: ExperienceSource, ahead=None):
        self.explorer = explorer
        self.experiences = experiences
        self.ahead = ahead
        self._explorer_state: dict[str, Any] | None = None

    def next(self, step: int, trainer_version: int) -> tuple[list, dict[str, Any]]:
        if self.ahead is not None:
            t0 = time.perf_counter()
            record, self._explorer_state = self.ahead.next_result(step)
            record = {**record, "time/wait": time.perf_counter() - t0}  # for the explorer thread
        else:
            record = self.explorer.explore_step(step)
            self._explorer_state = self.explorer.state_dict()
        maybe_die("explore", step)
        experiences, more = self.experiences.next(step, trainer_version, n=int(record["rollout/experiences"]))
        more["time/wait"] = more["time/wait"] + record.get("time/wait", 0.0)
        record.update(more)
        return experiences, record

    def load(self, resume: dict[str, Any]) -> None:
        self.explorer.load_state_dict(resume["explorer"])
        self.experiences.load(resume)

    def resume_state(self) -> dict[str, Any]:
        return {"explorer": self._explorer_state, **self.experiences.resume_state()}

    def checkpointed(self) -> None:
        self.experiences.checkpointed()

    def eval_in_loop(self, step: int) -> bool:
        return self.ahead is None or step == self.ahead.total  # the thread is done by the last step

    def after_step(self, step: int, eval_due: bool) -> None:
        self.experiences.after_step(step, eval_due)
        if self.ahead is not None and eval_due:
            self.ahead.request_eval(step)

    def close(self) -> None:
        if self.ahead is None:
            self.experiences.close()
            return
        self.ahead.sync.close()  # wakes a thread that waits for weights ...
        try:
            self.experiences.close()  # ... or to put into the queue (after an error in the trainer)
        finally:
            self.ahead.stop()


class DatasetSource:
    """Mode train from a dataset: ``batch_size`` rows a step (SFT examples or preference pairs)."""

    def __init__(self, data, batch_size: int):
        self.data = data
        self.batch_size = batch_size

    def next(self, step: int, trainer_version: int) -> tuple[list, dict[str, Any]]:
        batch = self.data.next_batch(self.batch_size)
        skipped = self.data.skipped_rows
        return batch, ({"train/skipped_rows": float(skipped)} if skipped else {})

    def load(self, resume: dict[str, Any]) -> None:
        self.data.load_state_dict(resume["data"])

    def resume_state(self) -> dict[str, Any]:
        return {"data": self.data.state_dict()}

    def checkpointed(self) -> None:
        pass

    def eval_in_loop(self, step: int) -> bool:
        return True

    def after_step(self, step: int, eval_due: bool) -> None:
        pass

    def close(self) -> None:
        pass

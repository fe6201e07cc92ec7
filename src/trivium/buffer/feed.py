"""How a stage's experiences travel from explorer to trainer: an in-process queue or a persistent storage.

Both offer ``put`` (explorer side) and ``take`` (trainer side). The storage feed claims what it hands
out, counts the use of a claim once the trainer has trained on it (``trained``: a replay policy may serve
it again from the next step, whatever the checkpoint interval), and commits the claims only once the
trainer's checkpoint that includes them is on disk (``checkpointed``): after a crash, ``resume`` commits
the claims the checkpoint recorded and hands every other claim back (its use undone), so each
experience is trained into the resumed model exactly as often as its use count says.
"""

from __future__ import annotations

from collections.abc import Sequence

from trivium.types import Experience


class MemoryFeed:
    """The in-process bounded queue; nothing survives the process (a resumed step is sampled again)."""

    def __init__(self, queue):
        self.queue = queue

    def put(self, experiences: Sequence[Experience]) -> None:
        self.queue.put(experiences)

    def take(self, n: int, step: int) -> list[Experience]:
        return self.queue.get(n)

    def open_claims(self) -> list[str]:
        return []

    def trained(self) -> None:
        pass

    def checkpointed(self) -> None:
        pass

    def resume(self, claims: Sequence[str]) -> None:
        pass

    def close(self) -> None:
        self.queue.close()


class StorageFeed:
    """A persistent storage: explore steps written under a key (idempotent), batches claimed then committed."""

    def __init__(
        self, storage, *, consumer: str = "trainer", policy=None, timeout_s: float = 600.0, waiting=None
    ):
        """``waiting``: called while a read waits (``ExperienceStorage.read``); its ``describe()``, where it
        has one, is added to a timeout's error (what the writer last did)."""
        from trivium.buffer.replay import FIFO

        self.storage = storage
        self.consumer = consumer
        self.policy = policy or FIFO
        self.timeout_s = timeout_s
        self.waiting = waiting
        self._open: list[str] = []  # claims since the last checkpoint, in read order
        self._used = 0  # how many of them are used (counted), the first ones

    def put(self, experiences: Sequence[Experience]) -> None:
        if experiences:
            self.storage.write(experiences, key=f"explore:{experiences[0].explore_step}")

    def take(self, n: int, step: int) -> list[Experience]:
        try:
            claim = self.storage.read(
                n,
                policy=self.policy,
                consumer=self.consumer,
                step=step,
                timeout=self.timeout_s,
                waiting=self.waiting,
            )
        except TimeoutError as error:
            describe = getattr(self.waiting, "describe", None)
            if type(error) is not TimeoutError or describe is None:
                raise
            raise TimeoutError(f"{error}. {describe()}") from error
        self._open.append(claim.token)
        return list(claim.experiences)

    def open_claims(self) -> list[str]:
        """Claims trained on since the last checkpoint: the next checkpoint records them."""
        return list(self._open)

    def trained(self) -> None:
        """The batches taken so far are trained on: count their uses (durable at the next checkpoint)."""
        for token in self._open[self._used :]:
            self.storage.use(token)
        self._used = len(self._open)

    def checkpointed(self) -> None:
        """The checkpoint recording ``open_claims()`` is durable: commit them."""
        for token in self._open:
            self.storage.commit(token)
        self._open.clear()
        self._used = 0

    def resume(self, claims: Sequence[str]) -> int:
        """After a restart: commit what the checkpoint trained on, hand back every other claim."""
        for token in claims:
            self.storage.commit(token)
        return self.storage.recover(self.consumer)

    def close(self) -> None:
        self.storage.close()

"""The interface of persistent experience storages, and the record format they all share.

Exactly-once across crashes (SIGKILL at any point, in the writer or the reader):

- ``write(experiences, key=...)`` is all-or-nothing and durable when it returns. With a ``key`` (e.g.
  ``"explore:17"``) it is idempotent: a producer that re-runs a step after a crash gets back the ids of
  the first write, and nothing is stored twice.
- ``read`` does not consume: it *claims* the rows for a consumer under a claim token, so no other
  reader gets them. ``use(claim)`` counts a use once the consumer has trained on them (a replay policy
  may serve them again from then on); ``commit(claim)`` makes it final (and counts the use if ``use``
  was not called).
- The trainer uses a claim after the step that trained on it and commits it once the checkpoint of that
  step is durable, storing the claim tokens in that checkpoint. On restart it calls ``commit`` again for
  the tokens in the checkpoint it resumes from (a no-op if they were committed), then
  ``recover(consumer)``, which hands every other claim of that consumer back, open or used (its uses
  undone): batches read after that checkpoint are served again, batches trained into it never are.

Delayed rewards (serve mode): ``write(..., pending=True)`` stores experiences whose reward is not known
yet. A pending experience is never read; ``attach_reward(task_id, reward)`` sets the reward of the pending
experiences of ``task_id`` (a served call's id) and makes them ready in one transaction, so a trainer
sees each of them once, with its reward, or not at all. A reward is attached once: a second one for the
same experience raises ``RewardConflict`` (the first may already be trained on), an id with no
experiences raises ``UnknownExperience``.

Records: ``experience_to_record`` turns an ``Experience`` into ``{"format", "fields", "tensors"}``:
every tensor field in one safetensors blob (dtype and shape kept exactly), every other field as a JSON
object. It walks the dataclass fields, so a field added to ``Experience`` later is stored without a
schema change. ``info`` goes through JSON: tuples come back as lists, and values JSON cannot hold
(tensors, numpy scalars, sets) are refused at write time, naming the key.

Left out: deleting or compacting consumed rows (keep them: they are the run's record), and a time-based
lease expiry (a consumer that never comes back leaves its claims open until ``recover`` is called
with its name).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypedDict

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from trivium.buffer.replay import FIFO, ReadPolicy
from trivium.types import Experience

__all__ = [
    "RECORD_FORMAT",
    "Claim",
    "ExperienceStorage",
    "Record",
    "RewardConflict",
    "Status",
    "StorageError",
    "UnknownExperience",
    "experience_to_record",
    "record_to_experience",
]

RECORD_FORMAT = 1
Status = Literal["pending", "ready", "claimed", "consumed"]  # pending: waits for its reward, never read
STATUSES: tuple[Status, ...] = ("pending", "ready", "claimed", "consumed")


class StorageError(RuntimeError):
    """A storage could not be opened or used, or a record or claim is not what it should be."""


class UnknownExperience(StorageError, LookupError):
    """``attach_reward`` named a task id (or a run index of it) that the storage holds no experience for."""


class RewardConflict(StorageError):
    """``attach_reward`` for experiences that already have a reward (attached before, or written ready)."""


@dataclass(frozen=True)
class Claim:
    """A batch handed to one consumer and not yet consumed.

    Keep ``token`` (a short string) in the checkpoint of the step that trains on the batch, and pass the
    claim or its token to ``commit`` once that checkpoint is durable.
    """

    token: str
    consumer: str
    step: int  # the consumer's step clock when it read (see replay.py)
    ids: tuple[int, ...]
    experiences: tuple[Experience, ...]

    def __len__(self) -> int:
        return len(self.ids)


class ExperienceStorage(Protocol):
    def write(
        self, experiences: Sequence[Experience], *, key: str | None = None, pending: bool = False
    ) -> list[int]:
        """Store all of ``experiences`` or none; durable on return. Returns their ids, in order.

        A ``key`` already written returns the ids stored under it and writes nothing. ``pending``: their
        rewards are not known yet; no reader gets them until ``attach_reward`` makes them ready.
        """
        ...

    def attach_reward(
        self,
        task_id: str,
        reward: float,
        *,
        run_index: int | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Set the reward of the pending experiences of ``task_id`` (only the one with ``run_index`` when
        given) and make them ready, all or none; ``info`` goes into their ``info["feedback"]``. Returns
        their ids. Raises ``UnknownExperience`` or ``RewardConflict`` (then nothing changed).
        """
        ...

    def read(
        self,
        n: int,
        *,
        policy: ReadPolicy = FIFO,
        consumer: str = "trainer",
        step: int | None = None,
        timeout: float | None = None,
        waiting: Callable[[], None] | None = None,
    ) -> Claim:
        """Claim ``n`` experiences, waiting up to ``timeout`` s (None: forever) until there are ``n``.

        Raises ``TimeoutError`` if fewer than ``n`` are available in time; nothing is claimed then.
        ``waiting`` is called between polls while the read waits; what it raises ends the read (e.g. the
        writer is known to be done: ``launch/explore_heartbeat.py``).
        """
        ...

    def use(self, claim: Claim | str) -> None:
        """The consumer trained on a claim: count the use of its experiences now (a replay policy may
        serve them again), to be made final by ``commit`` or undone by ``recover``. Idempotent."""
        ...

    def commit(self, claim: Claim | str) -> None:
        """Consume a claim for good (counting its use if ``use`` did not). Idempotent; a claim already
        handed back by ``recover`` is an error."""
        ...

    def recover(self, consumer: str) -> int:
        """Hand back every claim of ``consumer`` not committed (open, or used with the use undone);
        returns how many experiences became readable or had a use undone."""
        ...

    def count(self, status: Status | None = None) -> int: ...

    def close(self) -> None: ...


class Record(TypedDict):
    format: int
    fields: dict[str, Any]  # JSON-safe: every non-tensor field of the Experience
    tensors: bytes  # safetensors blob of every tensor field


def experience_to_record(experience: Experience) -> Record:
    tensors: dict[str, torch.Tensor] = {}
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(experience):
        value = getattr(experience, f.name)
        if isinstance(value, torch.Tensor):
            # clone: safetensors refuses views that share storage, and a device tensor must come to CPU
            tensors[f.name] = value.detach().to("cpu").contiguous().clone()
        else:
            fields[f.name] = json_safe(value, f"Experience.{f.name}", experience.task_id)
    return {"format": RECORD_FORMAT, "fields": fields, "tensors": save_tensors(tensors)}


def record_to_experience(record: Mapping[str, Any], where: str = "") -> Experience:
    """Inverse of ``experience_to_record``; ``where`` (e.g. "buffer.db row 17") goes into errors."""
    if record.get("format") != RECORD_FORMAT:
        raise StorageError(
            f"experience record {where} has format {record.get('format')!r}, this trivium reads format "
            f"{RECORD_FORMAT}; it was written by another trivium version, read it with that version"
        )
    known = {f.name for f in dataclasses.fields(Experience)}
    try:
        values = {**record["fields"], **load_tensors(bytes(record["tensors"]))}
    except Exception as error:
        raise StorageError(
            f"experience record {where} is damaged, its tensors do not decode: {error}"
        ) from error
    unknown = sorted(set(values) - known)
    if unknown:
        raise StorageError(
            f"experience record {where} has fields {unknown} that Experience does not know; it was "
            "written by a newer trivium version, read it with that version"
        )
    return Experience(**values)


def json_safe(value: Any, path: str, task_id: str) -> Any:
    """Check that ``value`` survives JSON; tuples are turned into lists. Errors name the offending key."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value  # NaN and inf included: Python's json writes and reads them
    if isinstance(value, (list, tuple)):
        return [json_safe(v, f"{path}[{i}]", task_id) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise StorageError(
                    f"{path} has the key {k!r} of type {type(k).__name__} (task {task_id!r}); experience "
                    "storages keep mappings as JSON, whose keys are strings: use str keys"
                )
            out[k] = json_safe(v, f"{path}[{k!r}]", task_id)
        return out
    raise StorageError(
        f"{path} holds a {type(value).__name__} (task {task_id!r}); experience storages keep it as JSON, "
        "which holds None, bool, int, float, str, lists and str-keyed mappings: convert it (e.g. "
        "tensor.tolist(), float(x)) before the experience leaves the workflow"
    )

"""Where data waits between components: task sets read from files, and the explorer→trainer queue."""

from trivium.buffer.queue import ExperienceQueue, QueueClosed
from trivium.buffer.replay import FIFO, ReplayPolicy
from trivium.buffer.storage import Claim, ExperienceStorage, StorageError
from trivium.buffer.task_files import TaskDataError
from trivium.buffer.task_reader import TaskSetReader

__all__ = [
    "FIFO",
    "Claim",
    "ExperienceQueue",
    "ExperienceStorage",
    "QueueClosed",
    "ReplayPolicy",
    "StorageError",
    "TaskDataError",
    "TaskSetReader",
]

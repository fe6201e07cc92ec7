"""The built-in weight-sync methods; importing this module registers them in ``SYNC_METHODS``."""

from trivium.sync.checkpoint import CheckpointSync
from trivium.sync.collective import CollectiveSync
from trivium.sync.memory import MemorySync
from trivium.sync.protocol import SYNC_METHODS

SYNC_METHODS.register("memory")(MemorySync)
SYNC_METHODS.register("checkpoint")(CheckpointSync)
SYNC_METHODS.register("collective")(CollectiveSync)

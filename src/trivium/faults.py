"""Crash injection for the resume tests: ``TRIVIUM_KILL_AT=point:step`` SIGKILLs the process there.

Points: ``explore`` (a step's experiences sampled, not yet trained), ``train`` (trained, not yet
checkpointed), ``checkpoint`` (inside the checkpoint write, before it is renamed into place), and
``rank{r}:train`` (trainer rank r > 0 of a multi-rank stage, before it joins step ``step``). Unset, a
check costs one dictionary lookup.
"""

import os
import signal


def maybe_die(point: str, step: int) -> None:
    target = os.environ.get("TRIVIUM_KILL_AT")
    if target and target == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)

"""Built-in environments; importing this module registers them (``base._load_builtins`` does, lazily).

``frozenlake`` (gymnasium's FrozenLake as text), ``tools`` and ``calculator`` (question answering with
tools). None of these imports gymnasium at module level: it is needed only when a gym-backed episode
starts, so the tool environments work without it.
"""

from trivium.envs import frozenlake, gym_adapter, tool_env  # noqa: F401  (register on import)

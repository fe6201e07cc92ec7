"""Typed configuration: the schema (the single home of defaults), its errors, YAML reading and overrides.
Loading a run's config with every check across fields is ``trivium.validation`` (above the runtime)."""

from trivium.config.errors import ConfigError, Problem
from trivium.config.overrides import apply_overrides
from trivium.config.schema import TriviumConfig

__all__ = ["ConfigError", "Problem", "TriviumConfig", "apply_overrides"]

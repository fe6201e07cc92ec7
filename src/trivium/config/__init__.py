"""Typed configuration: schema (the single home of defaults), loading with overrides, validation."""

from trivium.config.errors import ConfigError, Problem
from trivium.config.load import RunConfig, Stage, apply_overrides, load_config, validate_raw
from trivium.config.schema import TriviumConfig

__all__ = [
    "ConfigError",
    "Problem",
    "RunConfig",
    "Stage",
    "TriviumConfig",
    "apply_overrides",
    "load_config",
    "validate_raw",
]

"""A run's config loaded and checked against everything it names: the schema (``trivium.config``), then
every check across fields and against the runtime (registries, data files, models, placement), each problem
on its field. It sits above the runtime it checks; ``trivium.config`` (the schema) sits below everything."""

from trivium.validation.load import RunConfig, Stage, load_config, validate_raw

__all__ = ["RunConfig", "Stage", "load_config", "validate_raw"]

"""What every schema model shares: strict validation and the upper bounds of numeric fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # allow_inf_nan=False: every float field is finite (``.inf`` / ``.nan`` are refused, naming the field).
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True, allow_inf_nan=False
    )


# Upper bounds: far beyond any real run, low enough that nothing downstream overflows (timeouts must stay
# below threading.TIMEOUT_MAX; seeds within numpy's 2**32; counts within what fits in memory).
COUNT_MAX = 1_000_000  # rows, batch sizes, samples, tokens, model widths
STEPS_MAX = 1_000_000_000  # steps, intervals, uses
SECONDS_MAX = 1e7  # ~115 days
SEED_MAX = 2**32 - 1
# Below this a temperature is refused (0 is greedy): logits / T overflows to inf, and the sampler's
# softmax turns inf - inf into NaN. Shared by the config checks and the endpoint.
MIN_TEMPERATURE = 1e-3

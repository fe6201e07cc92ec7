"""Rollout models: the protocol the explorer samples through, engines behind it, and tiny local models.

Only the torch-free names are re-exported, so importing the package stays cheap. Import the rest from
their modules: ``trivium.models.transformers_engine.TransformersEngine``, ``trivium.models.tiny.make_tiny``,
``trivium.models.loading.{load_causal_lm, load_tokenizer, resolve_device, resolve_dtype}``.
"""

from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import FinishReason, Generation, RolloutModel, SamplingParams

__all__ = ["BatchingRolloutModel", "FinishReason", "Generation", "RolloutModel", "SamplingParams"]

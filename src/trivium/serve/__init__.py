"""Serve the rollout model behind an OpenAI-compatible endpoint and record agents' calls for training.

``OpenAIServer`` / ``create_app`` (``openai_server.py``) need the serve extras (fastapi, uvicorn; the
clients need openai); ``Recorder`` (``recorder.py``) does not. Names are loaded on first use, so importing
this package (or ``trivium``) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["OpenAIServer", "RecordedCall", "Recorder", "RecordingSession", "create_app"]

_WHERE = {
    "OpenAIServer": "trivium.serve.openai_server",
    "create_app": "trivium.serve.openai_server",
    "RecordedCall": "trivium.serve.experiences",
    "Recorder": "trivium.serve.recorder",
    "RecordingSession": "trivium.serve.recorder",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'trivium.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)

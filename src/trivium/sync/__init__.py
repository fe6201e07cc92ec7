"""Weight movement from the trainer to rollout models: one ``WeightSync`` protocol (``protocol.py``), the
memory, checkpoint and collective methods behind it, the version arithmetic (``versions.py``) and the one
post-load check (``weights.py``). See docs/sync.md."""

"""Weight synchronisation from trainer to rollout models (in memory: ``update_weights``; files: checkpoint)."""

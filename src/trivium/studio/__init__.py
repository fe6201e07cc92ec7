"""``trivium studio``: a web page to build configs, launch and watch runs, and compare them (docs/studio.md)."""

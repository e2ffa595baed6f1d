"""App logic behind app.py: the engine worker thread, per-session state and the handlers."""

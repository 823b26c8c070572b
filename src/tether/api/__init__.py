"""The Python API: ``tether.fit`` (one call) and ``tether.init`` (the user's own loop)."""

"""``malletraind``: event intake, the engine, the backend, the epoch coordinator, the API."""

"""Making and checking library entries: build, verify, curate, answer checks and the sandbox that runs an
entry's tests. Uses the engine's public API."""

"""Measurement and diagnosis commands: bench, bench-graft, calibrate, demo, doctor and the tiny models of
the architecture matrix. Each uses the engine's public API."""

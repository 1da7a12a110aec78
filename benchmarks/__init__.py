"""The course repository's benchmarks: ``tooling/`` times the course's own tools (not shipped)."""

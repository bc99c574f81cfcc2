"""The training rehearsal: a tiny model trained for real through every stage's own command, on CPU (docs/rehearsal.md)."""

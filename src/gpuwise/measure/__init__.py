"""Measure: real steps on a device in an isolated child process (OOM-safe)."""

"""Helpers the test modules share (one place for each)."""

"""Analyses: pure functions from the events and timeline frames to summary sections."""

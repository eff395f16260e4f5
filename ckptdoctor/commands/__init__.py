"""Subcommand flows: each builds views, runs the engine's checks, and returns a Report."""

"""The one rule engine every subcommand runs on: catalog, registry, selection, runner."""

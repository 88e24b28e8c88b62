"""Subcommands of the stepcal CLI."""

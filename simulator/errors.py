"""Errors a person can act on."""


class InputError(Exception):
    """Bad user input (a file, a row, a flag). The CLI prints `stepcal: <message>` and exits 2."""

"""The one error type of configuration: a message a user can act on (it names the flag, the value and the fix)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input to the configuration (a flag, an env twin, a config file, or a conflict between them).

    The message is complete on its own: CLI entry points print it and exit non-zero without a traceback.
    """

"""The error an option's parser raises (a usage error naming the option, said before any
test), in a module of its own so that every parser (``options``, ``identity_input``) can
raise it without importing the option table."""

from __future__ import annotations


class OptionError(ValueError):
    """A value that does not parse; the message says what is allowed."""

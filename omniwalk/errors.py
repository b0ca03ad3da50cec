"""Typed errors raised by omniwalk.

Every error a user can cause has its own type so the HTTP layer can map it to a status code
and an OpenAI-style body without parsing messages.
"""


class OmniwalkError(Exception):
    """Base class of every error omniwalk raises on purpose."""


class ConfigError(OmniwalkError, ValueError):
    """A model or engine config is missing a field or is inconsistent; the message names it."""


class CheckpointError(OmniwalkError):
    """A checkpoint directory is incomplete or does not match its config."""


class InvalidRequestError(OmniwalkError, ValueError):
    """A request cannot be served as written (bad content, unknown voice, too long, ...). ``param``
    names the request field at fault where one is (an OpenAI error body's ``param``)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class MediaError(InvalidRequestError):
    """Media bytes or arrays that cannot be decoded or violate a configured limit."""

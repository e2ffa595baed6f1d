"""Exception types. Every user-facing failure is one of these, so the CLI can print one line
and the app can show one message, while a running engine keeps serving its other requests."""


class VegasError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(VegasError, ValueError):
    """A request (prompt, sampling or speculation parameters) that the engine refuses."""


class ModelLoadError(VegasError):
    """A model path that does not exist, or a file that cannot be read as a model."""


class UnsupportedArchitectureError(ModelLoadError):
    """A readable model whose architecture our forward pass does not implement."""


class TraceError(VegasError, ValueError):
    """A trace file that is too large, malformed, too deep or of another schema version."""

"""Typed compiler errors; the service maps each to an HTTP status in one place."""


class CompilerError(Exception):
    """Base class for errors raised by the compiler package."""


class InvalidModelError(CompilerError):
    """The bytes are not a loadable TorchScript archive, or it does not run on its input spec."""


class InvalidSpecError(CompilerError):
    """An input spec string or object is malformed."""


class InputMismatchError(CompilerError):
    """Inputs given to a runner do not match the model's input spec."""


class BackendUnavailableError(CompilerError):
    """The backend cannot run on this host (missing library or hardware)."""


class ConversionError(CompilerError):
    """The backend failed to convert or build the model."""


class VerificationError(CompilerError):
    """A compiled artifact's outputs differ from the reference beyond tolerance."""

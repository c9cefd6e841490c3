"""Typed compiler errors; the service maps each to an HTTP status in one place."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class CompilerError(Exception):
    """Base class for errors raised by the compiler package."""


class InvalidModelError(CompilerError):
    """The bytes are not a loadable TorchScript archive, or it does not run on its input spec."""


class InvalidSpecError(CompilerError):
    """An input spec string or object is malformed."""


class InputMismatchError(CompilerError):
    """Inputs given to a runner do not match the model's input spec."""


class ModelRunError(CompilerError):
    """The model raised on a request's inputs: a size it cannot take, an index past its table."""


class BackendUnavailableError(CompilerError):
    """The backend cannot run on this host (missing library or hardware)."""


def failure(exc: BaseException) -> str:
    """An exception a model run raised, in a line: TorchScript's end with the real cause after a
    long interpreter trace."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    last = lines[-1][:300] if lines else ""
    kind = f"{type(exc).__name__}: "
    return last if last.startswith(kind) else kind + last  # TorchScript's names its type


@contextmanager
def raised_as(error: type[CompilerError], what: str) -> Iterator[None]:
    """What a model run inside raises, as `error`: "`what` <its failure>"; compiler errors as
    themselves."""
    try:
        yield
    except CompilerError:
        raise
    except Exception as exc:
        raise error(f"{what} {failure(exc)}") from None


class ConversionError(CompilerError):
    """The backend failed to convert or build the model."""


class VerificationError(CompilerError):
    """A compiled artifact's outputs differ from the reference beyond tolerance."""

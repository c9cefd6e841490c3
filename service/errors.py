"""Typed service errors. `service.api.problems` maps each to one HTTP status, in one place."""

from __future__ import annotations

from typing import ClassVar


class KilnError(Exception):
    status_code = 500
    title = "Internal error"
    # Response headers that tell the client what to do next.
    headers: ClassVar[dict[str, str]] = {}


class BadRequestError(KilnError):
    status_code = 400
    title = "Bad request"


class AlreadyExistsError(BadRequestError):
    """A name that is taken: a 400 over HTTP and ALREADY_EXISTS over gRPC, as Triton answers it."""


class UnauthorizedError(KilnError):
    status_code = 401
    title = "Unauthorized"


class ForbiddenError(KilnError):
    status_code = 403
    title = "Forbidden"


class NotFoundError(KilnError):
    status_code = 404
    title = "Not found"


class DeletedError(NotFoundError):
    """A version deleted after its request was routed to it."""


class ConflictError(KilnError):
    status_code = 409
    title = "Conflict"


class PayloadTooLargeError(KilnError):
    status_code = 413
    title = "Payload too large"


class InvalidConfigError(KilnError):
    status_code = 422
    title = "Invalid config"


class ClientGoneError(KilnError):
    """The client hung up while its request waited: it is not run. No one reads the answer;
    nginx's 499 keeps such requests out of both client and server errors."""

    status_code = 499
    title = "Client closed request"


class UnavailableError(KilnError):
    status_code = 503
    title = "Service unavailable"


class QueueFullError(UnavailableError):
    """A model's queue is at its max_queue_size: shed the request rather than queue it."""

    title = "Queue full"
    headers: ClassVar[dict[str, str]] = {"Retry-After": "1"}


class TimeoutExpiredError(UnavailableError):
    """A request's timeout passed before it was answered: it is not run, or not waited for."""

    title = "Request timeout expired"


class NotReadyError(UnavailableError):
    """The process is up but not ready to serve: it is still loading its models."""

    title = "Not ready"

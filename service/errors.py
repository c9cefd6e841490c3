"""Typed service errors. `service.api.problems` maps each to one HTTP status, in one place."""

from __future__ import annotations


class KilnError(Exception):
    status_code = 500
    title = "Internal error"


class BadRequestError(KilnError):
    status_code = 400
    title = "Bad request"


class UnauthorizedError(KilnError):
    status_code = 401
    title = "Unauthorized"


class ForbiddenError(KilnError):
    status_code = 403
    title = "Forbidden"


class NotFoundError(KilnError):
    status_code = 404
    title = "Not found"


class ConflictError(KilnError):
    status_code = 409
    title = "Conflict"


class PayloadTooLargeError(KilnError):
    status_code = 413
    title = "Payload too large"


class InvalidConfigError(KilnError):
    status_code = 422
    title = "Invalid config"


class UnavailableError(KilnError):
    status_code = 503
    title = "Service unavailable"

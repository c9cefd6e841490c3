"""Optional API keys in two scopes: `admin` (upload, delete, v2 repository load and unload, and
all of `infer`) and `infer`."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from enum import StrEnum
from typing import Any

from fastapi import Depends, Request
from fastapi.routing import APIRoute

from service.errors import ForbiddenError, InvalidConfigError, UnauthorizedError

log = logging.getLogger("kiln.auth")


class Scope(StrEnum):
    admin = "admin"
    infer = "infer"


# The examples that .env.example and deploy/base/secret.yaml ship: a key everyone can read.
PLACEHOLDERS = ("change-me", "replace-me")


def digest(key: str) -> str:
    """Keys are held and looked up by their SHA-256: a lookup's time then says nothing about
    the keys a guess shares a prefix with."""
    return hashlib.sha256(key.encode()).hexdigest()


def parse_keys(text: str) -> dict[str, Scope]:
    """`key1:admin,key2:infer` -> {digest(key): scope}."""
    keys: dict[str, Scope] = {}
    entries: dict[str, int] = {}
    for n, item in enumerate(filter(None, (part.strip() for part in text.split(","))), 1):
        key, sep, scope = item.rpartition(":")
        if not sep or not key or scope not in Scope.__members__:
            # Named by place and scope, never by the key: this goes to the logs.
            why = "it has no ':'" if not sep else "it has no key" if not key else f"its scope reads {scope!r}"
            raise InvalidConfigError(f"KILN_API_KEYS: entry {n} must be KEY:admin or KEY:infer; {why}")
        if key.lower().startswith(PLACEHOLDERS):
            raise InvalidConfigError(
                f"KILN_API_KEYS: entry {n} is the example's placeholder, not a key: set keys of your "
                "own (`openssl rand -hex 24`, say), or none to leave the API open on purpose"
            )
        hashed = digest(key)
        first = entries.setdefault(hashed, n)
        if first != n and keys[hashed] != scope:
            raise InvalidConfigError(f"KILN_API_KEYS: entry {n} gives entry {first}'s key another scope")
        keys[hashed] = Scope(scope)
    return keys


def presented_key(headers: Mapping[str, str]) -> str | None:
    """From HTTP headers or gRPC metadata, whose keys are lower case too."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return headers.get("x-api-key")


def require(scope: Scope) -> Callable[[Request], Coroutine[Any, Any, None]]:
    # Async though it never awaits: FastAPI runs a sync dependency in its threadpool, a thread
    # hop on every request for a dict lookup.
    async def check(request: Request) -> None:
        authorize(request.app.state.api_keys, presented_key(request.headers), scope)

    return check


def authorize(keys: Mapping[str, Scope], key: str | None, scope: Scope) -> None:
    """Raise unless `key` grants `scope`; with no keys configured, everything is open."""
    if not keys:
        return
    if key is None:
        raise UnauthorizedError("an API key is required: send `Authorization: Bearer <key>`")
    granted = keys.get(digest(key))
    if granted is None:
        raise UnauthorizedError("the API key is not valid")
    if scope == Scope.admin and granted != Scope.admin:
        raise ForbiddenError("this API key has the infer scope; this call needs admin")


# One check per scope, so that the scopes a route needs can be read from its dependencies.
CHECKS = {scope: require(scope) for scope in Scope}
# What a route declares in `dependencies=`, for the scope it needs.
infer_scope = [Depends(CHECKS[Scope.infer])]
admin_scope = [Depends(CHECKS[Scope.admin])]


def scopes_of(route: APIRoute) -> list[Scope]:
    """The scopes the route's dependencies check (its router's first), in the order they run."""
    checked = {check: scope for scope, check in CHECKS.items()}
    return [checked[dep.call] for dep in route.dependant.dependencies if dep.call in checked]

"""Triton's logging extension: what every process logs, changed at runtime.

`POST /v2/logging` (gRPC `LogSettings`) records the settings it changes in the store and applies
them at once in the process that took it; every other API and worker process, on this host or
another, applies the store's within `KILN_ROUTE_TTL_S`, as they follow an unload. They outlast a
restart, until changed again. The settings are Triton's, with Kiln's values where its logs differ:
- `log_info`, `log_warning`, `log_error`: whether lines of that level are written;
- `log_verbose_level`: 1 adds Kiln's DEBUG lines, 2 and above every library's too;
- `log_format`: `json` or `text`, as KILN_LOG_FORMAT (Triton's are `default` and `ISO8601`);
- `log_file`: only "", as Kiln writes to stderr for the container runtime to collect.
"""

from __future__ import annotations

import logging
import threading
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from service.logs import LEVELS, LogFormat, formatter, kiln_handlers
from service.periodic import Periodic
from service.store import Store, StoreUnavailableError

log = logging.getLogger("kiln.logs")

KIND, DOC_ID = "settings", "logging"


class LogSettings(BaseModel):
    """Triton's log settings document."""

    log_file: Literal[""] = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: LogFormat = "json"


class LogSettingsIn(BaseModel):
    """The settings to change; those left out or null keep their value. Strict, as Triton's parser
    is: no `1` taken for `true`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    log_file: str | None = Field(default=None, description="Only '': Kiln logs to stderr.")
    log_info: bool | None = None
    log_warning: bool | None = None
    log_error: bool | None = None
    log_verbose_level: int | None = Field(
        default=None,
        ge=0,
        le=2**32 - 1,  # gRPC carries it as a uint32
        description="0: none; 1: Kiln's DEBUG lines; 2 and above: every library's too.",
    )
    log_format: LogFormat | None = None

    @field_validator("log_file")
    @classmethod
    def _stderr_only(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("Kiln writes its log to stderr, for the container runtime to collect; send ''")
        return value


class LogControl(Periodic):
    """This process's log settings: applied at once when changed here, and read from the store
    every `interval_s` (at least MIN_INTERVAL_S) for changes made in another process."""

    MIN_INTERVAL_S = 0.5  # KILN_ROUTE_TTL_S may be 0: ask the store on every request

    def __init__(self, store: Store, fmt: LogFormat, interval_s: float) -> None:
        super().__init__("kiln-log-settings", max(interval_s, self.MIN_INTERVAL_S))
        self.store = store
        self.current = LogSettings(log_format=fmt)
        # Held from a store read or write to its apply: a read that an update here overtook
        # must not apply what it read, the settings from before that update.
        self._lock = threading.Lock()

    def update(self, changes: LogSettingsIn) -> LogSettings:
        """Record `changes` for every process, then apply them here; the settings now."""
        fields = changes.model_dump(exclude_none=True)
        with self._lock:
            self.store.create_doc(KIND, DOC_ID, {"id": DOC_ID})
            self.store.update_doc(KIND, DOC_ID, fields)
            return self._apply(fields)

    def run_once(self) -> None:
        """Apply what another process changed."""
        try:
            with self._lock:
                doc = self.store.get_doc(KIND, DOC_ID)
                if doc is not None:
                    self._apply({key: value for key, value in doc.items() if key in LogSettings.model_fields})
        except StoreUnavailableError as exc:  # the next pass reads it again
            log.debug("log settings not read: %s", exc)
        except Exception:  # a bug: logged, and the thread lives on
            log.exception("reading the log settings failed")

    def _apply(self, fields: dict[str, object]) -> LogSettings:
        try:
            settings = LogSettings.model_validate({**self.current.model_dump(), **fields})
        except ValidationError as exc:  # a record another version of Kiln wrote
            log.warning("stored log settings not applied: %s", exc)
            return self.current
        if settings != self.current:
            # Announced in whichever of the two settings writes INFO lines, if either does.
            if not settings.log_info:
                log.info("log settings now %s", settings.model_dump())
            _configure(settings)
            if settings.log_info:
                log.info("log settings now %s", settings.model_dump())
            self.current = settings
        return settings


def _configure(settings: LogSettings) -> None:
    off = {logging.INFO: settings.log_info, logging.WARNING: settings.log_warning}
    off |= {logging.ERROR: settings.log_error, logging.CRITICAL: settings.log_error}
    LEVELS.off = frozenset(level for level, on in off.items() if not on)
    verbose = settings.log_verbose_level
    logging.getLogger("kiln").setLevel(logging.DEBUG if verbose >= 1 else logging.NOTSET)
    logging.getLogger().setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
    for handler in kiln_handlers():
        handler.setFormatter(formatter(settings.log_format))

"""Triton's trace settings, shared by every API process of the deployment.

`POST /v2[/models/{name}]/trace/setting` (gRPC `TraceSetting`) records the settings it changes in
the store and applies them at once in the process that took it; every other API process applies
the store's within `KILN_ROUTE_TTL_S`, as it does the log settings. They outlast a restart, until
changed again. service.traces samples and writes the traces.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any

from pydantic import ValidationError

from service.periodic import Periodic
from service.store import Store, StoreUnavailableError
from service.traces import Traces, TraceSettings, TraceSettingsDoc, TraceSettingsIn

log = logging.getLogger("kiln.trace")

KIND, DOC_ID = "settings", "trace"
# The document holds a field per scope and setting, "server.trace_rate" or "model:<name>.trace_level",
# so that two processes changing different settings at once both keep theirs; null, one cleared.
SERVER, MODEL = "server", "model:"
COUNT_SET = "count_set"  # which setting of a scope's trace_count it traces by (TraceSettings)


class TraceControl(Periodic):
    """This process's trace settings: applied at once when changed here, and read from the store
    every `interval_s` (at least MIN_INTERVAL_S) for changes made in another process."""

    MIN_INTERVAL_S = 0.5

    def __init__(self, store: Store, traces: Traces, interval_s: float) -> None:
        super().__init__("kiln-trace-settings", max(interval_s, self.MIN_INTERVAL_S))
        self.store = store
        self.traces = traces
        self._applied: dict[str, dict[str, Any]] = {}  # the settings last applied, by scope
        # Held from a store read or write to its apply, as LogControl's.
        self._lock = threading.Lock()

    def update(self, model: str | None, changes: TraceSettingsIn) -> TraceSettingsDoc:
        """Record `changes` to the server's settings, or `model`'s, for every process; apply
        them here; the settings now. ValidationError, with nothing changed, for settings that are
        not valid once merged with those stored."""
        named = changes.changes()
        if "trace_count" in named:  # set again, it counts anew, though its value is the same
            named[COUNT_SET] = None if named["trace_count"] is None else uuid.uuid4().hex
        scope = SERVER if model is None else MODEL + model
        fields = {f"{scope}.{setting}": value for setting, value in named.items()}
        with self._lock:
            doc = scopes({**(self.store.get_doc(KIND, DOC_ID) or {}), **fields})
            settings = resolved(doc)
            self.store.create_doc(KIND, DOC_ID, {"id": DOC_ID})
            self.store.update_doc(KIND, DOC_ID, fields)
            self._apply(doc, settings)
        return self.traces.settings(model)

    def run_once(self) -> None:
        """Apply what another process changed."""
        try:
            with self._lock:
                doc = scopes(self.store.get_doc(KIND, DOC_ID) or {})
                if doc != self._applied:
                    self._apply(doc, resolved(doc))
        except StoreUnavailableError as exc:  # the next pass reads it again
            log.debug("trace settings not read: %s", exc)
        except ValidationError as exc:  # a record another version of Kiln wrote
            log.warning("stored trace settings not applied: %s", exc)
        except Exception:  # a bug: logged, and the thread lives on
            log.exception("reading the trace settings failed")

    def _apply(self, doc: dict[str, dict[str, Any]], settings: dict[str | None, TraceSettings]) -> None:
        self.traces.apply(settings)
        if doc != self._applied:
            shown = {scope: {k: v for k, v in own.items() if k != COUNT_SET} for scope, own in doc.items()}
            log.info("trace settings now %s", json.dumps(shown, sort_keys=True))
        self._applied = doc


def scopes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The stored fields by scope: those that set any of their settings."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in doc.items():
        scope, _, setting = key.rpartition(".")  # settings' names have no dot; models' may
        if value is not None and (scope == SERVER or scope.startswith(MODEL)):
            found.setdefault(scope, {})[setting] = value
    return found


def resolved(doc: dict[str, dict[str, Any]]) -> dict[str | None, TraceSettings]:
    """The settings each scope traces by: the server's (None), and each model's over them."""
    server = doc.get(SERVER, {})
    settings: dict[str | None, TraceSettings] = {None: TraceSettings.model_validate(server)}
    for key, own in doc.items():
        if key.startswith(MODEL):
            settings[key.removeprefix(MODEL)] = TraceSettings.model_validate({**server, **own})
    return settings

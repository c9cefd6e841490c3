"""Triton's trace extension: the timestamps of a sample of inference requests.

A traced request's timestamps are Triton's (REQUEST_START, QUEUE_START, COMPUTE_START,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END), in nanoseconds of the
process's monotonic clock, as Triton's are of its steady clock. Each trace is one log line of the
`kiln.trace` logger, written whatever the log settings, whose `trace` field holds Triton's trace
records: `jq -c -s '[.[] | .trace // empty | .[]]'` turns a log into Triton's trace file. The
settings are Triton's, global or per model (service.trace_settings shares them between processes):
- `trace_level`: `["OFF"]`, or `["TIMESTAMPS"]` to trace (not `TENSORS`);
- `trace_rate`: one request traced in so many;
- `trace_count`: how many more traces to take, in this process; -1 for no end;
- `trace_file` and `log_frequency`: only `""` and `0`, as the traces go to stderr as they end;
- `trace_mode`: only `triton`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from service.batcher import Phases

log = logging.getLogger("kiln.trace")

TraceLevel = Literal["OFF", "TIMESTAMPS"]
NS = 1e9


def _listed(value: object) -> object:
    return [value] if isinstance(value, str) else value


def _not_bool(value: object) -> object:
    """Triton's parser takes a number or its string; pydantic would take true for 1."""
    if isinstance(value, bool):
        raise ValueError("a number, or a string of one, not true or false")
    return value


Count = Annotated[int | None, BeforeValidator(_not_bool)]


def _only(*taken: object) -> BeforeValidator:
    """A setting of a trace file, which Kiln does not write: only its value that means none."""

    def check(value: object) -> object:
        # By type too: False and 0.0 equal 0, and are not what Triton's parser takes.
        if value is not None and not any(type(value) is type(t) and value == t for t in taken):
            raise ValueError(f"Kiln writes each trace to stderr, in its log, as it ends; send {taken[-1]!r}")
        return value

    return BeforeValidator(check)


class TraceSettings(BaseModel):
    """The settings one scope (the server's, or a model's) traces by."""

    trace_level: list[TraceLevel] = ["OFF"]
    trace_rate: int = Field(default=1000, ge=1)
    trace_count: int = Field(default=-1, ge=-1)
    log_frequency: int = 0
    trace_file: str = ""
    trace_mode: Literal["triton"] = "triton"
    # Which setting of trace_count this is: one named again (its traces spent, say) counts anew.
    count_set: str = ""

    @property
    def count(self) -> tuple[int, str]:
        """Its trace_count, and which setting of it."""
        return self.trace_count, self.count_set

    @property
    def tracing(self) -> bool:
        return "TIMESTAMPS" in self.trace_level

    def doc(self, remaining: int) -> TraceSettingsDoc:
        """As Triton shows them; `remaining`, the traces this process takes yet."""
        doc: dict[str, object] = {k: str(v) for k, v in self.model_dump(exclude={"count_set"}).items()}
        doc |= {"trace_level": self.trace_level, "trace_count": str(remaining)}
        return TraceSettingsDoc.model_validate(doc)


class TraceSettingsDoc(BaseModel):
    """Triton's trace settings response: every value a string, the level a list of them."""

    trace_level: list[str]
    trace_rate: str
    trace_count: str = Field(description="The traces this process takes yet; -1: no end.")
    log_frequency: str
    trace_file: str
    trace_mode: str


class TraceSettingsIn(BaseModel):
    """The settings to change, as Triton takes them: strings (numbers taken too), the level a
    string or a list of them; null clears a setting, back to the server's (for a model) or the
    default (for the server)."""

    model_config = ConfigDict(extra="forbid")

    trace_level: Annotated[list[TraceLevel] | None, BeforeValidator(_listed)] = Field(
        default=None,
        min_length=1,
        description="['OFF'], or ['TIMESTAMPS'] to trace; TENSORS is not offered.",
    )
    # Bounded as Triton's own types are: a uint32 rate, an int32 count.
    trace_rate: Count = Field(default=None, ge=1, le=2**32 - 1, description="One request traced in so many.")
    trace_count: Count = Field(
        default=None,
        ge=-1,
        le=2**31 - 1,
        description="How many more traces to take, in each process; -1: no end.",
    )
    log_frequency: Annotated[int | None, _only(0, "0")] = Field(
        default=None, description="Only '0': each trace is written as it ends."
    )
    trace_file: Annotated[str | None, _only("")] = Field(
        default=None, description="Only '': traces go to stderr, in the log."
    )
    trace_mode: Literal["triton"] | None = None

    @field_validator("trace_level")
    @classmethod
    def _one_level(cls, value: list[TraceLevel] | None) -> list[TraceLevel] | None:
        if value is not None and "OFF" in value and "TIMESTAMPS" in value:
            raise ValueError("OFF and TIMESTAMPS together; send one of them")
        return value

    def changes(self) -> dict[str, Any]:
        """The settings named, None for those cleared; stored as plain JSON."""
        return {key: getattr(self, key) for key in self.model_fields_set}

    @classmethod
    def cleared(cls) -> TraceSettingsIn:
        """Every setting given back (a model's, to the server's)."""
        return cls.model_validate(dict.fromkeys(cls.model_fields))


@dataclass
class Trace:
    """One traced request's timestamps, written to the log when it ends."""

    model: str
    started: float  # time.monotonic()
    version: int
    stamps: list[tuple[str, float]] = field(default_factory=list)

    def ran(self, phases: Phases) -> None:
        self.stamps += [
            ("QUEUE_START", phases.queued),
            ("COMPUTE_START", phases.compute),
            ("COMPUTE_INPUT_END", phases.input_end),
            ("COMPUTE_OUTPUT_START", phases.output_start),
            ("COMPUTE_END", phases.compute_end),
        ]

    def end(self, request_id: str | None) -> None:
        """Write Triton's records of it: its model, then one timestamp each."""
        trace_id = random.getrandbits(52)  # unique across the processes whose logs are merged
        stamps = [("REQUEST_START", self.started), *self.stamps, ("REQUEST_END", time.monotonic())]
        model = {"model_name": self.model, "model_version": self.version, "request_id": request_id or ""}
        records: list[dict[str, Any]] = [{"id": trace_id, **model}]
        records += [{"id": trace_id, "timestamps": [{"name": name, "ns": int(t * NS)}]} for name, t in stamps]
        log.info("trace of %s version %s", self.model, self.version, extra={"trace": records})


@dataclass
class _Scope:
    settings: TraceSettings
    remaining: int
    seen: int = 0  # requests sampled from


class Traces:
    """Which requests are traced, by the settings now: the server's, and those of models that
    set their own. Per process, as the count left is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scopes: dict[str | None, _Scope] = {None: _Scope(TraceSettings(), -1)}
        self.on = False  # whether any scope traces: the one check an untraced server makes

    def sample(self, model: str, started: float, version: int) -> Trace | None:
        """A trace of this request of `model`'s `version`, which arrived at `started`
        (time.monotonic()), if it is one of those sampled."""
        if not self.on:
            return None
        with self._lock:
            scope = self._scope(model)
            if not scope.settings.tracing or scope.remaining == 0:
                return None
            scope.seen += 1
            if scope.seen % scope.settings.trace_rate:
                return None
            if scope.remaining > 0:
                scope.remaining -= 1
        return Trace(model, started, version)

    def settings(self, model: str | None) -> TraceSettingsDoc:
        with self._lock:
            scope = self._scope(model)
            return scope.settings.doc(scope.remaining)

    def _scope(self, model: str | None) -> _Scope:
        """The model's own settings, or the server's. Under the lock."""
        return self._scopes.get(model) or self._scopes[None]

    def apply(self, settings: dict[str | None, TraceSettings]) -> None:
        """Trace by these settings from now: the server's (key None), and those of models that
        set their own. A scope keeps its count of requests, and of traces left unless its
        trace_count was set since, as Triton's; a model's scope that takes the server's
        trace_count anew (new, or its own cleared) starts from the traces the server has left,
        as Triton copies them."""
        with self._lock:
            old, self._scopes = self._scopes, {}
            server = old.get(None)
            for key, new in settings.items():
                was = old.get(key)
                if was is not None and was.settings.count == new.count:
                    self._scopes[key] = _Scope(new, was.remaining, was.seen)
                elif server is not None and server.settings.count == new.count:  # the server's count
                    self._scopes[key] = _Scope(new, server.remaining, 0 if was is None else was.seen)
                else:
                    self._scopes[key] = _Scope(new, new.trace_count, 0 if was is None else was.seen)
            self.on = any(s.settings.tracing for s in self._scopes.values())

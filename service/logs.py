"""Logging for `kiln serve` and `kiln worker`: JSON lines (or text), each carrying its request id.

One dictConfig serves both commands and uvicorn's own loggers (the access log included), and
uvicorn applies it again in each worker process it spawns.
"""

from __future__ import annotations

import json
import logging
import logging.config
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["json", "text"]

# Set per request by the API's middleware. Each request runs in its own task, and threads that
# handlers start through the threadpool copy the context, so every line a request causes has it.
request_id: ContextVar[str | None] = ContextVar("kiln_request_id", default=None)

NO_REQUEST = "-"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get() or NO_REQUEST
        return True


class LevelSwitch(logging.Filter):
    """Drops the lines of the levels that Triton's logging settings turned off at runtime
    (service.log_settings); one per process, on the handler that every logger's lines reach."""

    def __init__(self) -> None:
        super().__init__()
        self.off: frozenset[int] = frozenset()

    def filter(self, record: logging.LogRecord) -> bool:
        # A trace (service.traces) is written whatever the levels: the trace settings asked for it.
        return record.levelno not in self.off or hasattr(record, "trace")


LEVELS = LevelSwitch()


def level_switch() -> LevelSwitch:
    """dictConfig's factory for the process's one LevelSwitch."""
    return LEVELS


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, and request_id, exc_info and a
    trace's records when set."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", NO_REQUEST)
        if rid != NO_REQUEST:
            doc["request_id"] = rid
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack_info"] = self.formatStack(record.stack_info)
        if hasattr(record, "trace"):
            doc["trace"] = record.trace
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, a trace's records after the message."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        return f"{line} {json.dumps(record.trace)}" if hasattr(record, "trace") else line


def logging_config(fmt: LogFormat, level: str | int = "INFO") -> dict[str, Any]:
    """A dictConfig; uvicorn takes it as `log_config`."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}, "levels": {"()": level_switch}},
        "formatters": {"json": {"()": JsonFormatter}, "text": {"()": TextFormatter}},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": fmt,
                "filters": ["request_id", "levels"],
            }
        },
        "root": {"level": level, "handlers": ["default"]},
        # No handlers of their own: uvicorn's lines, the access log too, go through the root's.
        "loggers": {
            name: {"handlers": [], "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def setup_logging(fmt: LogFormat) -> None:
    logging.config.dictConfig(logging_config(fmt))
    capture_strays()


def kiln_handlers() -> list[logging.Handler]:
    """The root's handlers that `logging_config` made, not ones that an embedding app added."""
    return [h for h in logging.getLogger().handlers if LEVELS in h.filters]


def capture_strays() -> None:
    """Sends what bypasses the root's handler through it, as one line of the format each:
    Python's warnings, and torch's registered loggers, which torch gives stderr handlers of their
    own and keeps from propagating (`W1206 22:17:51.49 ... torch/onnx/...` lines). Call it once
    torch is imported."""
    logging.captureWarnings(True)
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        torch_logger = name == "torch" or name.startswith("torch.")
        if torch_logger and isinstance(logger, logging.Logger) and logger.handlers:
            logger.handlers.clear()
            logger.propagate = True


@dataclass(frozen=True)
class LogSetup:
    """A process's Kiln logging as it stands (runtime settings included), for a child to take up."""

    fmt: LogFormat
    root_level: int
    kiln_level: int
    off: frozenset[int]

    @classmethod
    def current(cls) -> LogSetup | None:
        """None where Kiln did not set up this process's logging."""
        handlers = kiln_handlers()
        if not handlers:
            return None
        fmt: LogFormat = "json" if isinstance(handlers[0].formatter, JsonFormatter) else "text"
        root = logging.getLogger().level
        # A child's libraries (the ONNX exporter's passes, a dozen lines a compile) log at INFO
        # what only log_verbose_level 2, a DEBUG root, asks for.
        child_root = root if root < logging.INFO else max(root, logging.WARNING)
        return cls(fmt, child_root, logging.getLogger("kiln").level, LEVELS.off)

    def apply(self) -> None:
        logging.config.dictConfig(logging_config(self.fmt, self.root_level))
        logging.getLogger("kiln").setLevel(self.kiln_level)
        LEVELS.off = self.off
        capture_strays()


def formatter(fmt: LogFormat) -> logging.Formatter:
    """The formatter `logging_config` gives `fmt`, for a change of format at runtime."""
    return JsonFormatter() if fmt == "json" else TextFormatter()

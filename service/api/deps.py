"""The services one app instance wires together, and how handlers reach them."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from service.api.shutdown import Shutdown
from service.log_settings import LogControl
from service.preload import Preload
from service.queue import JobQueue
from service.registry import Registry
from service.runtime import Runtime
from service.settings import Settings
from service.shared_memory import SharedMemory
from service.trace_settings import TraceControl

if TYPE_CHECKING:  # it deploys through these services
    from service.api.model_repository import Repository


@dataclass
class Services:
    settings: Settings
    registry: Registry
    queue: JobQueue
    runtime: Runtime
    preload: Preload
    shared_memory: SharedMemory
    logs: LogControl
    traces: TraceControl
    shutdown: Shutdown
    repository: Repository | None  # KILN_MODEL_REPOSITORY's
    checks: threading.BoundedSemaphore  # KILN_UPLOAD_CHECKS: uploads' models checked at once


async def services(request: Request) -> Services:
    """Async so that FastAPI calls it inline rather than in its threadpool."""
    found: Services = request.app.state.services
    return found


ServicesDep = Annotated[Services, Depends(services)]

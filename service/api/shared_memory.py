"""Triton's system shared-memory extension over HTTP (service.shared_memory holds the regions).

Registering and unregistering need the admin scope: a region gives the server's access to a
segment of this host. Reading the status needs the infer scope, as using a region does.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from service.api.auth import admin_scope, infer_scope
from service.api.bodies import json_body, json_request_body
from service.api.deps import ServicesDep
from service.api.protocol import ProtocolRoute
from service.api.schemas import ProtocolError, error_responses
from service.shared_memory import Region

router = APIRouter(
    prefix="/v2/systemsharedmemory",
    tags=["v2"],
    route_class=ProtocolRoute,
    responses=error_responses(ProtocolError, 400, 401, 403, 503),
)


class RegisterIn(BaseModel):
    # Strict, as Triton's parser is: no `true` or "8" taken for a number.
    model_config = ConfigDict(strict=True)

    key: str = Field(description="The segment's shm_open name, such as `/input0`.")
    offset: int = Field(default=0, ge=0, description="Where in the segment the region begins.")
    byte_size: int = Field(gt=0, description="The region's size in bytes.")


@router.get(
    "/status",
    operation_id="v2_shared_memory_status",
    summary="Every registered system shared-memory region.",
    dependencies=infer_scope,
)
def status(svc: ServicesDep) -> list[Region]:
    return svc.shared_memory.status()


@router.get(
    "/region/{name}/status",
    operation_id="v2_shared_memory_region_status",
    summary="One registered region.",
    dependencies=infer_scope,
    responses={404: {"model": ProtocolError, "description": "No region of that name is registered."}},
)
def region_status(name: str, svc: ServicesDep) -> list[Region]:
    return svc.shared_memory.status(name)


@router.post(
    "/region/{name}/register",
    operation_id="v2_shared_memory_register",
    summary="Register a byte range of a POSIX shared-memory segment of this host under a name.",
    dependencies=admin_scope,
    openapi_extra=json_request_body(RegisterIn),
    response_class=Response,
)
async def register(name: str, request: Request, svc: ServicesDep) -> Response:
    body = await json_body(request, RegisterIn, "{key, offset, byte_size}")
    await run_in_threadpool(svc.shared_memory.register, name, body.key, body.offset, body.byte_size)
    return Response()


@router.post(
    "/unregister",
    operation_id="v2_shared_memory_unregister_all",
    summary="Unregister every region.",
    dependencies=admin_scope,
    response_class=Response,
)
def unregister_all(svc: ServicesDep) -> Response:
    svc.shared_memory.unregister()
    return Response()


@router.post(
    "/region/{name}/unregister",
    operation_id="v2_shared_memory_unregister",
    summary="Unregister one region; an unknown name is no error.",
    dependencies=admin_scope,
    response_class=Response,
)
def unregister(name: str, svc: ServicesDep) -> Response:
    svc.shared_memory.unregister(name)
    return Response()

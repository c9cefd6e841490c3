"""Triton's logging extension over HTTP (service.log_settings holds the settings). Reading them
needs the infer scope, as the other extensions do; changing them, for every process of the
deployment, needs admin."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service.api.auth import admin_scope, infer_scope
from service.api.bodies import json_body, json_request_body
from service.api.deps import ServicesDep
from service.api.protocol import ProtocolRoute
from service.api.schemas import ProtocolError, error_responses
from service.log_settings import LogSettings, LogSettingsIn

router = APIRouter(
    prefix="/v2/logging",
    tags=["v2"],
    route_class=ProtocolRoute,
    responses=error_responses(ProtocolError, 400, 401, 403),
)


@router.get(
    "", operation_id="v2_log_settings", summary="This process's log settings.", dependencies=infer_scope
)
def log_settings(svc: ServicesDep) -> LogSettings:
    return svc.logs.current


@router.post(
    "",
    operation_id="v2_update_log_settings",
    summary="Change log settings in every process of the deployment; the settings now.",
    dependencies=admin_scope,
    responses=error_responses(ProtocolError, 503),
    openapi_extra=json_request_body(LogSettingsIn),
)
async def update_log_settings(request: Request, svc: ServicesDep) -> LogSettings:
    body = await json_body(request, LogSettingsIn, "an object of the log settings to change")
    return await run_in_threadpool(svc.logs.update, body)

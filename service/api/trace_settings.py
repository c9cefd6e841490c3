"""Triton's trace extension over HTTP (service.traces holds the settings): the server's at
`/v2/trace/setting`, a model's at `/v2/models/{name}/trace/setting`. Reading them needs the infer
scope, as the other extensions do; changing them, for every process of the deployment, needs admin."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from service.api.auth import admin_scope, infer_scope
from service.api.bodies import json_body, json_request_body
from service.api.deps import Services, ServicesDep
from service.api.problems import validation_detail
from service.api.protocol import ProtocolRoute
from service.api.schemas import ProtocolError, error_responses
from service.errors import BadRequestError
from service.traces import TraceSettingsDoc, TraceSettingsIn

router = APIRouter(
    prefix="/v2",
    tags=["v2"],
    route_class=ProtocolRoute,
    responses=error_responses(ProtocolError, 400, 401, 403, 404),
)
SHAPE = "an object of the trace settings to change, each a string (the level a list of them) or null"


@router.get(
    "/trace/setting",
    operation_id="v2_trace_settings",
    summary="The server's trace settings, in this process.",
    dependencies=infer_scope,
)
def trace_settings(svc: ServicesDep) -> TraceSettingsDoc:
    return svc.runtime.traces.settings(None)


@router.post(
    "/trace/setting",
    operation_id="v2_update_trace_settings",
    summary="Change the server's trace settings in every process of the deployment; the settings now.",
    dependencies=admin_scope,
    responses=error_responses(ProtocolError, 503),
    openapi_extra=json_request_body(TraceSettingsIn),
)
async def update_trace_settings(request: Request, svc: ServicesDep) -> TraceSettingsDoc:
    return await updated(svc, None, await json_body(request, TraceSettingsIn, SHAPE))


@router.get(
    "/models/{name}/trace/setting",
    operation_id="v2_model_trace_settings",
    summary="The trace settings of a model: its own, the server's for the rest.",
    dependencies=infer_scope,
)
async def model_trace_settings(name: str, svc: ServicesDep) -> TraceSettingsDoc:
    await run_in_threadpool(svc.registry.check_model, name)
    return svc.runtime.traces.settings(name)


@router.post(
    "/models/{name}/trace/setting",
    operation_id="v2_update_model_trace_settings",
    summary="Change a model's own trace settings in every process; null gives one back to the server's, "
    "and a body naming none gives all back, as in Triton.",
    dependencies=admin_scope,
    responses=error_responses(ProtocolError, 503),
    openapi_extra=json_request_body(TraceSettingsIn),
)
async def update_model_trace_settings(name: str, request: Request, svc: ServicesDep) -> TraceSettingsDoc:
    changes = await json_body(request, TraceSettingsIn, SHAPE)
    if not changes.model_fields_set:  # Triton's request to remove the model's own settings
        changes = TraceSettingsIn.cleared()
    await run_in_threadpool(svc.registry.check_model, name)
    return await updated(svc, name, changes)


async def updated(svc: Services, model: str | None, changes: TraceSettingsIn) -> TraceSettingsDoc:
    """The settings after `changes`; a 400 for a change that leaves them not valid."""
    try:
        return await run_in_threadpool(svc.traces.update, model, changes)
    except ValidationError as exc:
        raise BadRequestError(f"the trace settings would not be valid: {validation_detail(exc)}") from None

"""Triton's model-repository and statistics extensions, under /v2. Loading and unloading are
management calls, as on TorchServe's management API: they need the admin scope. An unload is
recorded in the store, so that every worker process and replica stops serving the model, not
only the one that received it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from service.api.auth import admin_scope, infer_scope
from service.api.deps import ServicesDep
from service.api.protocol import ProtocolRoute, version_number
from service.api.schemas import ProtocolError, error_responses
from service.errors import NotFoundError
from service.router import serving_version

router = APIRouter(
    tags=["v2"],
    route_class=ProtocolRoute,
    dependencies=infer_scope,
    responses=error_responses(ProtocolError, 400, 401, 403, 404, 503),
)


class IndexRequest(BaseModel):
    ready: bool = False


@router.post("/v2/repository/index", operation_id="v2_repository_index", summary="Every model and its state.")
def repository_index(svc: ServicesDep, body: IndexRequest | None = None) -> list[dict[str, Any]]:
    index = []
    for view in svc.registry.list_models():
        try:
            version, _ = serving_version(view, svc.runtime.targets)
            number, state, reason = str(version.version), "READY", ""
        except NotFoundError as exc:
            number, state, reason = "", "UNAVAILABLE", str(exc)
        if view.unloaded:
            state, reason = "UNAVAILABLE", "unloaded"
        entry = {"name": view.name, "version": number, "state": state, "reason": reason}
        if entry["state"] == "READY" or not (body and body.ready):
            index.append(entry)
    return index


@router.post(
    "/v2/repository/models/{name}/load",
    operation_id="v2_repository_load",
    dependencies=admin_scope,
    summary="Serve a model again after an unload, and load and warm up its serving variants now.",
)
async def load_model(name: str, svc: ServicesDep) -> Response:
    await run_in_threadpool(svc.registry.set_unloaded, name, False)
    svc.runtime.reroute(name)
    await run_in_threadpool(svc.runtime.warm, name)
    return Response()


@router.post(
    "/v2/repository/models/{name}/unload",
    operation_id="v2_repository_unload",
    dependencies=admin_scope,
    summary="Take a model out of service, as Triton does: it is not ready and refuses inference "
    "(409) on every replica until it is loaded again, and its runners are freed.",
)
def unload_model(name: str, svc: ServicesDep) -> Response:
    svc.registry.set_unloaded(name, True)
    svc.runtime.unload(name)
    return Response()


@router.get("/v2/models/stats", operation_id="v2_all_stats", summary="Inference statistics of every model.")
def all_stats(svc: ServicesDep) -> dict[str, Any]:
    return {"model_stats": svc.runtime.stats.doc()}


@router.get(
    "/v2/models/{name}/stats", operation_id="v2_model_stats", summary="A model's inference statistics."
)
def model_stats(name: str, svc: ServicesDep) -> dict[str, Any]:
    svc.registry.get_model(name)
    return {"model_stats": svc.runtime.stats.doc(name)}


@router.get(
    "/v2/models/{name}/versions/{version}/stats",
    operation_id="v2_model_version_stats",
    summary="One version's inference statistics.",
)
def model_version_stats(name: str, version: str, svc: ServicesDep) -> dict[str, Any]:
    number = version_number(version)
    svc.registry.get_version(name, number)
    return {"model_stats": svc.runtime.stats.doc(name, number)}

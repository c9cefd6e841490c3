"""Triton's model-repository and statistics extensions, under /v2. Loading and unloading are
management calls, as on TorchServe's management API: they need the admin scope. An unload is
recorded in the store, so that every worker process and replica stops serving the model, not
only the one that received it."""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from service.api.auth import admin_scope, infer_scope
from service.api.bodies import bounded_body, parsed
from service.api.deps import Services, ServicesDep
from service.api.protocol import ProtocolRoute, version_number
from service.api.schemas import ProtocolError, error_responses
from service.api.triton_load import LoadRequest, load_request, load_with
from service.errors import BadRequestError, PayloadTooLargeError
from service.registry import ModelView
from service.router import servable
from service.store import StoreUnavailableError
from service.triton_repository import VERSION_HEADER

log = logging.getLogger("kiln.api")

router = APIRouter(
    tags=["v2"],
    route_class=ProtocolRoute,
    dependencies=infer_scope,
    responses=error_responses(ProtocolError, 400, 401, 403, 404, 503),
)


class IndexRequest(BaseModel):
    ready: bool = Field(False, strict=True, description="Only the versions that are ready.")


class LoadIn(BaseModel):
    parameters: dict[str, str | bool | int] = Field(
        default_factory=dict,
        description="config: the JSON of Triton's model configuration; file:<version>/model.pt: the "
        "TorchScript file in base64, which uploads a new version; file:<name>: a label file an "
        "output's label_filename names.",
    )


@router.post(
    "/v2/repository/index",
    operation_id="v2_repository_index",
    summary="Every version and its state.",
    openapi_extra={
        "requestBody": {"content": {"application/json": {"schema": IndexRequest.model_json_schema()}}}
    },
)
async def repository_index(request: Request, svc: ServicesDep) -> list[dict[str, Any]]:
    # JSON whatever the content type, as tritonserver reads it (`curl -d` says a form's), and
    # none at all from tritonclient.
    body = await request.body()
    ready = parsed(body, IndexRequest, '{"ready": true or false}').ready if body.strip() else False
    return await run_in_threadpool(index, svc, ready)


def index(svc: Services, ready_only: bool) -> list[dict[str, Any]]:
    """Blocking: each version in the store and its state here, as tritonserver lists each version
    it has loaded; and the model repository's directories that deployed none, with why."""
    entries = []
    views = svc.registry.list_models()
    for view in views:
        for version, variants in sorted(view.versions, key=lambda pair: pair[0].version):
            if view.unloaded:
                state, reason = "UNAVAILABLE", "unloaded"
            elif servable(variants, svc.runtime.targets):
                state, reason = "READY", ""
            else:
                state, reason = "UNAVAILABLE", "no variant of this version is ready on this host"
            if state == "READY" or not ready_only:
                entries.append(
                    {"name": view.name, "version": str(version.version), "state": state, "reason": reason}
                )
    if svc.repository is not None and not ready_only:
        names = {view.name for view in views}
        entries += [
            {"name": name, "version": "", "state": "UNAVAILABLE", "reason": why}
            for name, why in list(svc.repository.failures.items())  # a poll may change it meanwhile
            if name not in names  # else an earlier deploy's versions stand
        ]
    return sorted(entries, key=lambda entry: entry["name"])  # stable: a model's versions in order


@router.post(
    "/v2/repository/models/{name}/load",
    operation_id="v2_repository_load",
    dependencies=admin_scope,
    summary="Serve a model again after an unload, and load and warm up its serving variants now; "
    "with a config, apply it, and with a model file too, upload it as a new version first.",
    openapi_extra={"requestBody": {"content": {"application/json": {"schema": LoadIn.model_json_schema()}}}},
    # The app's body limit is KILN_MAX_UPLOAD_MB; this body carries a file of up to that in
    # base64, and the route bounds it itself (FastAPI's route limit cannot read the settings).
    max_body_size=2**62,
    response_class=Response,
    responses={
        200: {
            "description": "Loaded; Triton's empty answer.",
            "headers": {
                VERSION_HEADER: {
                    "description": "With a config: the version it made, or found when the files "
                    "and configuration repeat an earlier version's, or changed.",
                    "schema": {"type": "integer"},
                }
            },
        }
    },
)
async def load_model(name: str, request: Request, svc: ServicesDep) -> Response:
    # A model file travels in base64, a third larger than the KILN_MAX_UPLOAD_MB it is held to.
    limit = svc.settings.max_request_bytes * 4 // 3 + 1024 * 1024
    try:
        body = await bounded_body(request, limit)
    except PayloadTooLargeError:
        raise PayloadTooLargeError(
            f"the load request is over {limit} bytes, what a model file of KILN_MAX_UPLOAD_MB "
            f"({svc.settings.max_upload_mb} MB) takes in base64, with its configuration"
        ) from None
    load = await run_in_threadpool(http_load_request, body) if body.strip() else LoadRequest(None, {})
    made = await triton_load(svc, name, load)
    return Response(headers={} if made is None else {VERSION_HEADER: str(made)})


def http_load_request(body: bytes) -> LoadRequest:
    """The JSON body's parameters, its `file:` ones in base64 as tritonclient writes them."""
    parameters = parsed(body, LoadIn, 'Triton\'s load request, {"parameters": {"config": "..."}}').parameters
    files = {}
    for path, value in parameters.items():
        if path.startswith("file:"):
            try:
                files[path] = base64.b64decode(str(value), validate=True)
            except binascii.Error:
                raise BadRequestError(f"{path}: the file's content must be base64") from None
    return load_request({k: v for k, v in parameters.items() if k not in files}, files)


async def triton_load(svc: Services, name: str, load: LoadRequest) -> int | None:
    """Triton's load: the configuration and files, if any, then the model back in service, its
    serving runners loaded and warmed up in this process; unless it was unloaded meanwhile. The
    version a configuration made, found or changed."""
    since = await run_in_threadpool(svc.registry.last_unload, name)
    made = None
    if load.config is not None:
        made = await run_in_threadpool(load_with, svc, name, load)
    elif svc.repository is not None:  # its directory read again, as tritonserver's load does
        await run_in_threadpool(svc.repository.reload, svc, name)
    if await run_in_threadpool(in_service, svc, name, since):
        await run_in_threadpool(svc.runtime.warm, name)
    return made


def in_service(svc: Services, name: str, since: str | None) -> bool:
    """Blocking: the model serves again, on every replica, from this process's next request;
    unless it was unloaded after `since` (Registry.serve_again), and stays so."""
    if not svc.registry.serve_again(name, since):
        log.info("model %r was unloaded while it loaded: it stays unloaded", name)
        return False
    svc.runtime.reroute(name, loaded=True)
    return True


@router.post(
    "/v2/repository/models/{name}/unload",
    operation_id="v2_repository_unload",
    dependencies=admin_scope,
    summary="Take a model out of service, as Triton does: it is not ready and refuses inference "
    "(409) on every replica until it is loaded again, and its runners are freed.",
    response_class=Response,
)
def unload_model(name: str, svc: ServicesDep) -> Response:
    out_of_service(svc, name)
    return Response()


def out_of_service(svc: Services, name: str) -> None:
    """Blocking: no replica serves the model until it is loaded again; this process frees its
    runners once the requests it has in flight are answered."""
    svc.registry.set_unloaded(name, True)
    svc.runtime.unload(name)


@router.get("/v2/models/stats", operation_id="v2_all_stats", summary="Inference statistics of every model.")
def all_stats(svc: ServicesDep) -> dict[str, Any]:
    try:
        ready = ready_versions(svc, svc.registry.list_models())
    except StoreUnavailableError:  # what this process counted, which it has in memory
        ready = []
    return {"model_stats": svc.runtime.stats.doc(ready=ready)}


@router.get(
    "/v2/models/{name}/stats", operation_id="v2_model_stats", summary="A model's inference statistics."
)
def model_stats(name: str, svc: ServicesDep) -> dict[str, Any]:
    view = svc.registry.get_model(name)
    return {"model_stats": svc.runtime.stats.doc(name, ready=ready_versions(svc, [view]))}


@router.get(
    "/v2/models/{name}/versions/{version}/stats",
    operation_id="v2_model_version_stats",
    summary="One version's inference statistics.",
)
def model_version_stats(name: str, version: str, svc: ServicesDep) -> dict[str, Any]:
    number = version_number(version)
    record = svc.registry.get_version(name, number)
    ready = not svc.registry.is_unloaded(name) and servable(
        svc.registry.variants_of(record), svc.runtime.targets
    )
    return {"model_stats": svc.runtime.stats.doc(name, number, [(name, number)] if ready else [])}


def ready_versions(svc: Services, views: list[ModelView]) -> list[tuple[str, int]]:
    """The versions that would serve here: not unloaded, with a variant ready on this host."""
    return [
        (view.name, record.version)
        for view in views
        if not view.unloaded
        for record, variants in view.versions
        if servable(variants, svc.runtime.targets)
    ]

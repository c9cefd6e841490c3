"""Compiling more of an existing version: other backends or tuning, targets that joined since its
upload, and variants that failed, without a new upload or version."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from service.api.auth import admin_scope
from service.api.deps import Services, services
from service.api.models import (
    check_backends,
    check_targets,
    plan_targets,
    planned,
    unavailable,
    unserved_targets,
)
from service.api.schemas import CompileIn, CompileOut, Problem, SkippedOut, VariantOut, error_responses
from service.records import Options, VariantRecord, VariantStatus, options_key
from service.router import REFERENCE

router = APIRouter(tags=["models"])
RETRIED = {VariantStatus.failed, VariantStatus.rejected}

Wanted = tuple[str, Options, str]  # backend, options, target


def identity(backend: str, options: Options, target: str) -> tuple[str, str, str]:
    return backend, options_key(options), target


def skip(asked: Wanted, reason: str) -> SkippedOut:
    backend, options, target = asked
    return SkippedOut(backend=backend, options=options, target=target, reason=reason)


@router.post(
    "/v1/models/{name}/versions/{version}/variants",
    operation_id="compile_version",
    summary="Compile more of a version: other backends or tuning, targets that joined since its "
    "upload, and its failed variants again; each new variant is verified and raced as at upload.",
    status_code=202,
    response_model=CompileOut,
    responses={
        200: {"model": CompileOut, "description": "Nothing to compile: every variant asked for is there."},
        **error_responses(Problem, 401, 403, 404, 422, 503),
    },
    dependencies=admin_scope,
)
def compile_version(
    name: str, version: int, body: CompileIn, svc: Annotated[Services, Depends(services)]
) -> Any:
    record = svc.registry.get_version(name, version)
    requests = body.requests(record.config)
    where = "backends" if body.backends is not None else "the version's backends"
    check_backends(requests, where, record.spec().largest_batch)
    check_targets(svc, body.targets, "targets")
    targets = plan_targets(svc, record.config.targets if body.targets is None else body.targets)
    existing = {identity(v.backend, v.options, v.target): v for v in svc.registry.variants_of(record)}
    wanted: list[Wanted] = []
    retried: list[VariantRecord] = []
    skipped: list[SkippedOut] = []
    for request, target in planned(requests, targets):
        found = existing.get(identity(request.name, request.options, target))
        reason = unavailable(svc, request, target)
        if found is not None and found.status not in RETRIED:
            reason = f"already {found.status}"
        elif found is not None and not body.retry_failed:
            reason = f"already {found.status}: {found.error} (retry_failed compiles it again)"
        if reason is not None:
            if found is None or request.name != REFERENCE:  # a GPU's TorchScript was not asked for
                skipped.append(skip((request.name, request.options, target), reason))
        elif found is None:
            wanted.append((request.name, request.options, target))
        else:
            retried.append(found)
    queued = svc.registry.add_variants(record, wanted, retried)
    for _, job in queued:
        svc.queue.enqueue(job)
    taken = {identity(v.backend, v.options, v.target) for v, _ in queued}
    for asked in [*wanted, *((v.backend, v.options, v.target) for v in retried)]:
        if identity(*asked) not in taken:
            skipped.append(skip(asked, "already queued by another request"))
    out = CompileOut(
        name=name,
        version=version,
        queued=[VariantOut.of(v) for v, _ in queued],
        skipped=skipped,
        unserved_targets=unserved_targets(svc, (v for v, _ in queued)),
    )
    return JSONResponse(out.model_dump(mode="json"), status_code=202 if queued else 200)

"""TensorFlow Serving's REST model metadata, `GET /v1/models/{name}[/versions/{v}]/metadata`: the
model's one signature, `serving_default`, with its inputs' and outputs' TensorFlow data types and
shapes (-1 for a dynamic dimension), as TensorFlow Serving answers it. Its clients, and tools that
read a model's signature before they call `:predict` (KServe's V1 protocol), read Kiln's unchanged.
Errors are `{"error": "..."}`, as TensorFlow Serving's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from service.api.auth import infer_scope
from service.api.deps import Services, ServicesDep
from service.api.protocol import ProtocolRoute, version_number
from service.api.schemas import ProtocolError, error_responses
from service.api.v2 import described

# A numpy dtype's name -> TensorFlow's DataType name.
TF_DTYPES = {
    "float16": "DT_HALF",
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "int8": "DT_INT8",
    "int16": "DT_INT16",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "uint8": "DT_UINT8",
    "uint16": "DT_UINT16",
    "uint32": "DT_UINT32",
    "uint64": "DT_UINT64",
    "bool": "DT_BOOL",
}
SIGNATURE = "serving_default"

router = APIRouter(
    tags=["kserve-v1"],
    route_class=ProtocolRoute,
    dependencies=infer_scope,
    responses=error_responses(ProtocolError, 400, 401, 403, 404, 503),
)


def tensor_info(name: str, dtype: str, shape: Sequence[int]) -> dict[str, Any]:
    return {
        "dtype": TF_DTYPES.get(dtype, "DT_INVALID"),
        "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in shape], "unknown_rank": False},
        "name": name,
    }


def metadata_doc(svc: Services, name: str, version: int | None) -> dict[str, Any]:
    """TensorFlow Serving's GetModelMetadataResponse as JSON, for the version a request naming
    `version` (or none) would be described by, loaded or not, as v2's metadata. A tensor's name is
    its input or output name, where TensorFlow Serving gives its graph's (`x:0`)."""
    _, record = described(svc, name, version)
    signature = {
        "inputs": {t.name: tensor_info(t.name, t.dtype, t.shape) for t in record.config.inputs},
        "outputs": {o.name: tensor_info(o.name, o.dtype, o.shape) for o in record.outputs},
        "method_name": "tensorflow/serving/predict",
        "defaults": {},  # TensorFlow's SignatureDef has had it since 2023, and TF Serving prints it
    }
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(record.version)},
        "metadata": {"signature_def": {"signature_def": {SIGNATURE: signature}}},
    }


@router.get(
    "/v1/models/{name}/metadata",
    operation_id="v1_protocol_metadata",
    summary="TensorFlow Serving's model metadata: the signature of the version that serves.",
)
async def metadata(name: str, svc: ServicesDep) -> dict[str, Any]:
    return await run_in_threadpool(metadata_doc, svc, name, None)


@router.get(
    "/v1/models/{name}/versions/{version}/metadata",
    operation_id="v1_protocol_version_metadata",
    summary="TensorFlow Serving's model metadata of one version.",
)
async def version_metadata(name: str, version: str, svc: ServicesDep) -> dict[str, Any]:
    return await run_in_threadpool(metadata_doc, svc, name, version_number(version))

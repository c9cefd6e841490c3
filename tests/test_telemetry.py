"""KILN_OPENTELEMETRY: FastAPI's spans name each request's route, v2 and KServe V1 inference
included (which otherwise skip the framework's middleware and router, in service/api/hot_path.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan
from opentelemetry.util.types import AttributeValue

from service.api.app import create_app
from service.settings import Settings
from tests.client import infer_body, sample
from tests.models import MODELS


class Span(NonRecordingSpan):
    def __init__(self, name: str, attributes: Mapping[str, AttributeValue] | None) -> None:
        super().__init__(INVALID_SPAN_CONTEXT)
        self.name = name
        self.attributes = dict(attributes or {})

    def is_recording(self) -> bool:
        return True

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        self.attributes.update(attributes)

    def update_name(self, name: str) -> None:
        self.name = name


class Tracer(trace.Tracer):
    def __init__(self, spans: list[Span]) -> None:
        self.spans = spans

    def start_span(self, name: str, *args: Any, attributes: Any = None, **kwargs: Any) -> Span:
        span = Span(name, attributes)
        self.spans.append(span)
        return span

    @contextmanager
    def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> Iterator[Span]:
        yield self.start_span(name, attributes=kwargs.get("attributes"))


class Provider(trace.TracerProvider):
    def __init__(self) -> None:
        self.spans: list[Span] = []

    def get_tracer(self, *args: Any, **kwargs: Any) -> Tracer:
        return Tracer(self.spans)


def test_inference_spans_name_their_route(tmp_path: Path) -> None:
    # FastAPI takes the global provider when KILN_OPENTELEMETRY is on; nothing else in the test
    # process traces (every other app has it off).
    provider = Provider()
    trace.set_tracer_provider(provider)
    app = create_app(Settings(data_dir=tmp_path, grpc_port=0, opentelemetry=True, max_upload_mb=1))
    with TestClient(app) as client:
        body = infer_body(sample(MODELS["mlp"], 1))
        response = client.post("/v2/models/nope/infer", json=body, headers={"X-Request-ID": "traced"})
        kserve = client.post("/v1/models/nope:predict", json={"instances": [[0.5] * 64]})
        big = client.post("/v2/models/nope/infer", content=b"\0" * (2 << 20), headers={"X-Request-ID": "big"})
    assert response.status_code == 404 and response.headers["x-request-id"] == "traced"
    # A body declared past KILN_MAX_UPLOAD_MB, refused by the framework before the handler runs,
    # in the protocol's error shape still.
    assert big.status_code == 413 and big.headers["x-request-id"] == "big", big.text
    assert "KILN_MAX_UPLOAD_MB allows 1048576" in big.json()["error"]
    # Through the framework's router too, KServe V1 answers in its own error shape.
    assert kserve.status_code == 404 and kserve.json() == {"error": "no model named 'nope'"}
    routes = [span.attributes.get("http.route") for span in provider.spans]
    assert "/v2/models/{name}/infer" in routes, [(s.name, s.attributes) for s in provider.spans]
    assert "/v1/models/{name}:predict" in routes

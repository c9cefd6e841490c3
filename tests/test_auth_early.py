"""The API key is checked before any of a request's body is read, on the routes whose body FastAPI
parses as on the others: FastAPI reads it (a whole upload, spooled to disk) before it solves the
route's dependencies, the key check among them. A caller without the key's scope gets its 401 or
403 at once, as every other route answers it, however large a body it declares."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.client import predict, sample, scrape, upload, value
from tests.models import MODELS
from tests.servers import KilnServer, running

ADMIN, INFER = "admin-secret", "infer-secret"
MLP = MODELS["mlp"]
DECLARED = 900_000  # the body each request below declares, and never sends
# Every route whose body FastAPI parses, with the scope it needs.
BODY_ROUTES = [
    ("POST", "/v1/models", "multipart/form-data; boundary=kiln", "admin"),
    ("POST", "/v1/models/mlp/predict", "application/json", "infer"),
    ("POST", "/v1/models/mlp/versions/1/predict", "application/json", "infer"),
    ("PUT", "/v1/models/mlp/default-version", "application/json", "admin"),
    ("PATCH", "/v1/models/mlp/versions/1/serving", "application/json", "admin"),
    ("POST", "/v1/models/mlp/versions/1/variants", "application/json", "admin"),
]
ADMIN_ROUTES = [route[:3] for route in BODY_ROUTES if route[3] == "admin"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    root = tmp_path_factory.mktemp("auth-early")
    env = {"KILN_DATA_DIR": str(root / "data"), "KILN_API_KEYS": f"{ADMIN}:admin,{INFER}:infer"}
    with running(srv := KilnServer(env, root / "kiln.log")):
        yield srv


Answer = tuple[int, dict[str, str], bytes]


def head_only(server: KilnServer, method: str, path: str, headers: dict[str, str]) -> Answer:
    """The answer to a request that declares a body of DECLARED bytes and sends none of it: where
    the server waits for the body, the read times out."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest(method, path)
        for name, text in {"Content-Length": str(DECLARED), **headers}.items():
            conn.putheader(name, text)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def same_answer(got: Answer, reference: httpx.Response, request_id: str) -> None:
    status, headers, body = got
    assert status == reference.status_code, body
    assert headers["content-type"] == reference.headers["content-type"]
    assert json.loads(body) == reference.json()
    assert headers["x-request-id"] == request_id


@pytest.mark.parametrize(("method", "path", "content_type"), [route[:3] for route in BODY_ROUTES])
@pytest.mark.parametrize("key", [None, "wrong"])
def test_a_missing_or_wrong_key_is_refused_before_the_body(
    server: KilnServer, method: str, path: str, content_type: str, key: str | None
) -> None:
    auth = {} if key is None else {"Authorization": f"Bearer {key}"}
    reference = httpx.get(f"{server.url}/v1/models", headers=auth)  # a route with no body
    assert reference.status_code == 401
    headers = {"Content-Type": content_type, "X-Request-ID": "early-401", **auth}
    same_answer(head_only(server, method, path, headers), reference, "early-401")


@pytest.mark.parametrize(("method", "path", "content_type"), ADMIN_ROUTES)
def test_an_infer_key_is_refused_admin_routes_before_the_body(
    server: KilnServer, method: str, path: str, content_type: str
) -> None:
    auth = {"X-API-Key": INFER}
    reference = httpx.delete(f"{server.url}/v1/models/mlp", headers=auth)
    assert reference.status_code == 403
    headers = {"Content-Type": content_type, "X-Request-ID": "early-403", **auth}
    same_answer(head_only(server, method, path, headers), reference, "early-403")


def test_a_protocol_route_refuses_in_its_own_shape(server: KilnServer) -> None:
    reference = httpx.post(f"{server.url}/v2/repository/models/mlp/unload")
    assert reference.status_code == 401 and "error" in reference.json()
    headers = {"Content-Type": "application/json", "X-Request-ID": "early-v2"}
    same_answer(head_only(server, "POST", "/v2/repository/index", headers), reference, "early-v2")


def test_malformed_json_without_a_key_is_401_not_422(server: KilnServer) -> None:
    def post(key: dict[str, str]) -> httpx.Response:
        headers = {"Content-Type": "application/json", **key}
        return httpx.post(f"{server.url}/v1/models/mlp/predict", content=b"{not json", headers=headers)

    refused = post({})
    assert refused.status_code == 401, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert post({"X-API-Key": INFER}).status_code == 422  # a key's body is parsed as before


def test_keys_with_the_scope_are_served_and_refusals_count_on_their_route(server: KilnServer) -> None:
    with httpx.Client(base_url=server.url, timeout=120, headers={"X-API-Key": ADMIN}) as admin:
        before = scrape(admin)
        response = upload(admin, MLP, name="served", backends=[])
        assert response.status_code == 202, response.text
    with httpx.Client(base_url=server.url, timeout=60, headers={"X-API-Key": INFER}) as infer:
        assert predict(infer, "served", sample(MLP, 2)).status_code == 200
        assert infer.post("/v1/models", files={"file": ("m.pt", b"PK")}).status_code == 403
        head_only(server, "POST", "/v1/models/served/predict", {"Content-Type": "application/json"})
        after = scrape(infer)

    def added(code: str, route: str) -> float:
        labels = {"code": code, "route": route}
        return value(after, "kiln_http_errors_total", **labels) - value(
            before, "kiln_http_errors_total", **labels
        )

    assert added("403", "/v1/models") == 1
    assert added("401", "/v1/models/{name}/predict") == 1

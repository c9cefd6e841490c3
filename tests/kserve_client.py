"""kserve's InferenceRESTClient, run in a process of its own: kserve's gRPC messages and
tritonclient's share the protobuf package `inference`, and one process's registry holds only
one of them. Reads `[[method, kwargs], ...]` as JSON on stdin, calls each with the server's URL
(argv[1]) as the client's base_url, and prints the results as JSON: a refused call as
`{"status", "message"}`, the message as kserve's client words it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from kserve import InferenceRESTClient, RESTConfig


async def main(url: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    results: list[Any] = []
    async with InferenceRESTClient(RESTConfig(protocol="v1", timeout=60)) as client:
        for method, kwargs in calls:
            try:
                results.append(await getattr(client, method)(url, **kwargs))
            except httpx.HTTPStatusError as exc:
                results.append({"status": exc.response.status_code, "message": str(exc)})
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], json.load(sys.stdin)))))

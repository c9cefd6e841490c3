"""The overhead baseline: a bare FastAPI endpoint that calls the TorchScript runner directly.

It takes the same request as Kiln's v2 binary infer (JSON header + raw FP32 bytes, one input) and
answers in the same shape, decoding only what it needs: no auth, routing, validation or batching.
`BareServer` starts it as benchmarks/serving.py does, with uvicorn's default settings (one
process, uvloop, httptools) and no access log, as `kiln serve` runs Kiln (KILN_ACCESS_LOG is off
by default; the log costs about a tenth of a small model's CPU a request):

    KILN_BENCH_MODEL=model.pt KILN_BENCH_INPUT='x:float32[-1,64]' \
        python -m uvicorn benchmarks.bare_app:create_app --factory --host 127.0.0.1 --port 8001 \
        --no-access-log
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
from fastapi import FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from compiler.artifact import Artifact
from compiler.backends import get_backend
from compiler.spec import InputSpec
from tests.servers import free_port, wait_until

HEADER_LENGTH = "Inference-Header-Content-Length"
ROOT = Path(__file__).resolve().parents[1]


def create_app() -> FastAPI:
    spec = InputSpec.parse([os.environ["KILN_BENCH_INPUT"]], max_batch_size=64)
    payload = Path(os.environ["KILN_BENCH_MODEL"]).read_bytes()
    runner = get_backend("torchscript").load(Artifact("torchscript", "any", spec, payload))
    name = spec.names[0]
    app = FastAPI()

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request) -> Response:
        body = await request.body()
        length = int(request.headers[HEADER_LENGTH])
        tensor = json.loads(body[:length])["inputs"][0]
        x = np.frombuffer(body, np.float32, offset=length).reshape(tensor["shape"])
        outputs = await run_in_threadpool(runner.run, {name: x})
        docs, chunks = [], []
        for key, array in outputs.items():
            raw = array.astype("<f4", copy=False).tobytes()
            docs.append(
                {
                    "name": key,
                    "datatype": "FP32",
                    "shape": list(array.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            )
            chunks.append(raw)
        header = json.dumps({"model_name": model, "outputs": docs}, separators=(",", ":")).encode()
        return Response(
            b"".join([header, *chunks]),
            media_type="application/octet-stream",
            headers={HEADER_LENGTH: str(len(header))},
        )

    return app


class BareServer:
    """This app as a uvicorn subprocess on a free loopback port."""

    def __init__(self, model: Path, spec: str, threads: int, log: Path, workers: int = 1) -> None:
        self.port = free_port()
        self.workers = workers
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "KILN_BENCH_MODEL": str(model),
            "KILN_BENCH_INPUT": spec,
            "OMP_NUM_THREADS": str(threads),
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "uvicorn", "benchmarks.bare_app:create_app", "--factory"),
                    *("--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)),
                    "--no-access-log",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(lambda: httpx.get(f"{self.url}/docs").status_code == 200, 60, "the bare app")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

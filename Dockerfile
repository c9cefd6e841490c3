# syntax=docker/dockerfile:1
# Kiln, CPU image. One image runs both roles:
#   docker run kiln                      -> `kiln serve --host 0.0.0.0 --port 8000` (the API; gRPC on 8001)
#   docker run kiln worker               -> `kiln worker` (compile jobs; needs KILN_REDIS_URL)

ARG PYTHON_IMAGE=python:3.11-slim

# ---- builder: a venv at /opt/venv with the project and its dependencies ----
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first, pinned to the version in pyproject.toml, from the CPU index: on PyPI the plain
# torch wheel for Linux x86_64 is the CUDA build, which pulls several GB of nvidia-* wheels that
# a CPU image never uses. The later `pip install .` sees torch==2.13.0 satisfied (2.13.0+cpu).
RUN pip install --upgrade pip==26.3 \
    && pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

# torch above sits in its own layer, so a code change reinstalls only the lighter packages.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY compiler ./compiler
COPY service ./service
RUN pip install . \
    && python -c "import torch, tvm, service.cli; assert not torch.version.cuda, torch.version.cuda"

# ---- runtime ----
FROM ${PYTHON_IMAGE}

# g++ is a runtime need, not a build one: the worker (and embedded `kiln serve`) compiles
# models, and TVM's export_library links the generated code into a shared library with it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ tini \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 kiln \
    && useradd --system --uid 10001 --gid kiln --home-dir /home/kiln --create-home kiln \
    && mkdir -p /data \
    && chown kiln:kiln /data

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KILN_DATA_DIR=/data

# /data holds models and artifacts in embedded mode (no KILN_REDIS_URL): mount a volume there.
# With Redis everything lives in Redis and /data stays empty.
# Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
WORKDIR /home/kiln
EXPOSE 8000 8001

# No curl in the slim image; python's urllib does the probe. Only meaningful for `serve`:
# compose turns it off for the worker, and Kubernetes ignores HEALTHCHECK (it has its probes).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

# tini as PID 1 reaps orphans: a compile or upload check stopped past its limit is killed with
# its tree, and its compilers and tuning workers, reparented to PID 1, would stay zombies under
# kiln. It passes signals on, so `docker stop` still stops kiln gracefully.
ENTRYPOINT ["tini", "--", "kiln"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

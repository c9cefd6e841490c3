#!/usr/bin/env bash
# Kiln on a GPU host, end to end: the GPU unit tests and, beside them, redis-server, `kiln serve`
# and a GPU `kiln worker` on loopback, the test models and a ResNet-18 compiled with TensorRT
# (fp32, fp16) and TVM (for the CPU and for the GPU), a table of each variant's latency and error
# against eager, what the API serves alone and batched, and the speed goals (scripts/gpu_report.py).
#
#   scripts/gpu_check.sh [--wheels WHEELS_DIR] [gpu_report.py options, e.g. --targets cuda-sm90]
#
# For a bare host that has a CUDA build of torch 2.13 (the CUDA torch image). What else Kiln needs
# (torch-tensorrt, TVM, FastAPI, ...) is installed from the wheels in WHEELS_DIR, never from an
# index: pip install --no-index --find-links WHEELS_DIR. Without --wheels the check uses the
# packages already importable (PYTHONPATH included). Without redis-server on PATH it runs `kiln
# serve` in embedded mode instead, which compiles for every local target itself.
# Exit status: non-zero when the GPU tests fail or any variant fails verification.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS=
if [[ ${1:-} == --wheels ]]; then
    WHEELS=${2:?usage: scripts/gpu_check.sh [--wheels WHEELS_DIR] [gpu_report.py options]}
    shift 2
fi
PYTHON=${PYTHON:-python3}
PIDS=()

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT

fail() {
    echo "gpu_check: $*" >&2
    exit 1
}

# The tests' own picker: below the ephemeral range, where no outgoing connection can take it.
free_port() {
    "$PYTHON" -c 'from tests.servers import free_port; print(free_port())'
}

# The pairing Dockerfile.gpu builds: torch-tensorrt 2.13 is built for torch 2.13 and CUDA 13, and
# with another CUDA its tests would skip and only the report would fail, for a less clear reason.
"$PYTHON" -c 'import torch; assert torch.version.cuda, "torch " + torch.__version__ + " is a CPU build"
assert torch.__version__.startswith("2.13.") and torch.version.cuda.startswith("13."), (
    "torch " + torch.__version__ + " for CUDA " + torch.version.cuda + ", not 2.13 for CUDA 13")
assert torch.cuda.is_available(), "CUDA is not available to torch (driver? device?)"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))' ||
    fail "needs torch 2.13 built for CUDA 13 and a visible GPU"
WORK=$(mktemp -d -t kiln-gpu-check-XXXXXX)  # after the check: a refused run leaves nothing

# Everything pyproject.toml asks for, the gpu extra and the test runner, but torch: the CUDA
# torch is already here, and a wheel from WHEELS_DIR must never replace it.
install_wheels() {
    local requirements
    mapfile -t requirements < <("$PYTHON" - "$ROOT/pyproject.toml" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
dev = [r for r in extras["dev"] if re.match(r"(pytest|pytest-timeout)\b", r)]
for requirement in project["dependencies"] + extras["gpu"] + dev:
    if not re.match(r"torch\b(?!-)", requirement):
        print(requirement)
EOF
    )
    "$PYTHON" -m pip install --no-index --find-links "$WHEELS" "${requirements[@]}" ||
        fail "could not install ${requirements[*]} from $WHEELS"
    "$PYTHON" -c 'import torch; assert torch.version.cuda, "pip replaced the CUDA torch"'
}

if [[ -n $WHEELS ]]; then
    install_wheels
else
    echo "gpu_check: no --wheels; using the packages already installed" >&2
fi

# TVM turns its CUDA C into cubins with NVRTC through cuda-bindings by default; without that
# package, nvcc does it (TVM_CUDA_COMPILE_MODE, read by TVM at each compile).
if [[ -z ${TVM_CUDA_COMPILE_MODE:-} ]] && ! "$PYTHON" -c 'import cuda.bindings.nvrtc' 2>/dev/null &&
    command -v nvcc >/dev/null; then
    echo "gpu_check: no cuda-bindings; TVM compiles CUDA C with nvcc" >&2
    export TVM_CUDA_COMPILE_MODE=nvcc
fi

export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
cd "$ROOT"
"$PYTHON" -m service.cli targets

# The GPU tests run beside the service: each compiles on its own CPU cores, and the device time
# a GPU host is lent for is short. pytest-xdist, where present, spreads them over 4 processes.
PYTEST=(-q -p no:cacheprovider tests/test_gpu.py)
if "$PYTHON" -c 'import xdist' 2>/dev/null; then
    PYTEST+=(-n 4)
fi
"$PYTHON" -m pytest "${PYTEST[@]}" >"$WORK/pytest.log" 2>&1 &
TESTS=$!
PIDS+=("$TESTS")

export KILN_DATA_DIR=$WORK/data KILN_WORKER_METRICS_PORT=0 KILN_LOG_FORMAT=text
export KILN_COMPILE_WORKERS=${KILN_COMPILE_WORKERS:-4}
if command -v redis-server >/dev/null; then
    REDIS_PORT=$(free_port)
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
        >"$WORK/redis.log" 2>&1 &
    PIDS+=($!)
    export KILN_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
else
    echo "gpu_check: no redis-server on PATH; running kiln serve in embedded mode" >&2
fi

PORT=$(free_port)
"$PYTHON" -m service.cli serve --host 127.0.0.1 --port "$PORT" >"$WORK/serve.log" 2>&1 &
PIDS+=($!)
if [[ -n ${KILN_REDIS_URL:-} ]]; then
    "$PYTHON" -m service.cli worker >"$WORK/worker.log" 2>&1 &
    PIDS+=($!)
fi
# Python, not curl: a bare image may not have curl.
if ! "$PYTHON" - "http://127.0.0.1:$PORT/healthz" <<'EOF'; then
import sys, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen(sys.argv[1], timeout=2)
        break
    except OSError:
        time.sleep(1)
else:
    sys.exit(1)
EOF
    tail -n 40 "$WORK"/*.log
    fail "kiln serve did not come up"
fi

status=0
"$PYTHON" scripts/gpu_report.py --url "http://127.0.0.1:$PORT" "$@" || {
    status=1
    tail -n 60 "$WORK"/serve.log "$WORK"/worker.log 2>/dev/null || true
}
wait "$TESTS" || status=1
echo "gpu_check: tests/test_gpu.py"
tail -n 40 "$WORK/pytest.log"
echo "gpu_check: logs in $WORK"
exit $status

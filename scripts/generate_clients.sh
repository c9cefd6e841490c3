#!/usr/bin/env bash
# Regenerate openapi.json from the app, then both SDKs from that one file.
#
#   scripts/generate_clients.sh                  # openapi.json, clients/python, clients/typescript/src
#   scripts/generate_clients.sh python DIR       # only the Python SDK, into DIR
#   scripts/generate_clients.sh typescript DIR   # only the TypeScript sources, into DIR
#
# The one-SDK forms write elsewhere from the committed openapi.json: tests/test_clients.py
# diffs their output against the committed SDKs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath "${VENV:-$ROOT/.venv}")
TS_DIR=$ROOT/clients/typescript
# The generator's post-hooks call `ruff`: use the venv's pinned one, so formatting is reproducible.
export PATH="$VENV/bin:$PATH" RUFF_NO_CACHE=true

python_sdk() {
    local out=$1 work
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    python "$ROOT/scripts/openapi.py" --binary-format "$work/openapi.json"
    openapi-python-client generate --path "$work/openapi.json" \
        --config "$ROOT/clients/openapi-python-client.yaml" --meta uv --output-path "$out" --overwrite \
        --fail-on-warning >/dev/null
}

typescript_sdk() {
    local out=$1
    if [[ ! -x $TS_DIR/node_modules/.bin/openapi-ts ]]; then
        (cd "$TS_DIR" && npm ci --no-audit --no-fund --ignore-scripts)
    fi
    # From the package folder: the generator reads its config and tsconfig.json there.
    (cd "$TS_DIR" && node_modules/.bin/openapi-ts --silent --output "$out")
}

case ${1:-all} in
    all)
        python "$ROOT/scripts/openapi.py"
        python_sdk "$ROOT/clients/python"
        typescript_sdk "$TS_DIR/src"
        ;;
    python) python_sdk "$(realpath -m "$2")" ;;
    typescript) typescript_sdk "$(realpath -m "$2")" ;;
    *)
        echo "usage: $0 [python DIR | typescript DIR]" >&2
        exit 2
        ;;
esac

"""Write the app's OpenAPI spec to openapi.json, or check that the committed file is current.

    python scripts/openapi.py             # (re)write openapi.json at the repository root
    python scripts/openapi.py --check     # exit 1 when openapi.json differs from the app's spec
    python scripts/openapi.py --binary-format PATH
                                          # openapi.json plus `format: binary` on file fields, for
                                          # generators that predate OpenAPI 3.1's contentMediaType

Every operation must set an explicit operation_id, a tag and a summary or description: the SDKs
name their functions and modules after them, so a missing one fails here rather than in a client.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "openapi.json"
# This checkout's service/, whichever checkout the venv's editable install points at.
sys.path.insert(0, str(ROOT))


def build_app() -> FastAPI:
    # Imported here: --binary-format reads only openapi.json and must not need the app.
    from service.api.app import create_app
    from service.settings import Settings

    # Defaults only, no KILN_* environment: the committed spec must not depend on who wrote it.
    return create_app(Settings.model_construct())


def undocumented(app: FastAPI) -> list[str]:
    """Operations an SDK could not name or document well."""
    problems = []
    # The routes of the included routers: FastAPI includes a router as a whole, not route by route.
    for route in iter_route_contexts(app.routes):
        if not isinstance(route.original_route, APIRoute) or not route.include_in_schema:
            continue
        where = f"{','.join(sorted(route.methods or ()))} {route.path}"
        # FastAPI derives an id from the function name and path when none is set: it changes
        # whenever either does, and with it every SDK function name.
        if not route.operation_id:
            problems.append(f"{where}: no explicit operation_id")
        if not route.tags:
            problems.append(f"{where}: no tag")
        if not (route.summary or route.description):
            problems.append(f"{where}: no summary or description")
    return problems


def render(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def with_binary_format(node: Any) -> Any:
    """Mark `contentMediaType: application/octet-stream` strings as `format: binary` too.

    openapi-python-client 0.29 reads file fields only from `format: binary` (its issue #1417), and
    FastAPI now writes the OpenAPI 3.1 form alone; without this the SDK uploads `str(bytes)`.
    """
    if isinstance(node, list):
        return [with_binary_format(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: with_binary_format(value) for key, value in node.items()}
    if out.get("type") == "string" and out.get("contentMediaType") == "application/octet-stream":
        out.setdefault("format", "binary")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail when openapi.json is out of date")
    mode.add_argument("--binary-format", type=Path, metavar="PATH", help="write the compat spec here")
    args = parser.parse_args(argv)

    if args.binary_format:
        spec = json.loads(SPEC.read_text(encoding="utf-8"))
        args.binary_format.write_text(render(with_binary_format(spec)), encoding="utf-8")
        return 0

    app = build_app()
    problems = undocumented(app)
    if problems:
        print("operations the SDKs cannot name or document:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    text = render(app.openapi())
    if args.check:
        if not SPEC.exists() or SPEC.read_text(encoding="utf-8") != text:
            print(f"{SPEC.name} is out of date: run scripts/generate_clients.sh", file=sys.stderr)
            return 1
        return 0
    SPEC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``/openapi.json``, ``/docs`` (Swagger UI) and ``/redoc``: the API's documents, behind the read gate.

FastAPI's own document routes are turned off (:func:`server.api.app.create_app`) and
served here instead, so they follow ``TILETUNE_REQUIRE_READ_TOKEN`` like every read:
when reads need a token, so do the documents (send ``Authorization: Bearer TOKEN``).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from server.api.auth import read_access

OPENAPI_PATH = "/openapi.json"
router = APIRouter(include_in_schema=False, dependencies=[Depends(read_access)])


def _openapi_url(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/") + OPENAPI_PATH


@router.get(OPENAPI_PATH)
def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=_openapi_url(request), title=f"{request.app.title} - Swagger UI")


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_openapi_url(request), title=f"{request.app.title} - ReDoc")

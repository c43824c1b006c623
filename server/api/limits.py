"""Request limits, checked before any work: the body's size and JSON structure, the workload's size.

- :class:`BodyLimits` (ASGI middleware, before routing and parsing): a body over
  ``TILETUNE_MAX_BODY_BYTES`` (declared or streamed), or a JSON body with more
  structural characters (``{ [ , :``) than any valid body of the API can hold, gets a
  413. A JSON text of n values holds at least n - 1 of them, so counting them (at
  memchr speed) bounds the values, keys and nesting that the parser and the validator
  would see: a 1 MiB body of 100,000 unknown keys is refused for the cost of a scan,
  instead of producing 100,000 validation errors on the event loop.
- :func:`check_workload`: a workload over what the deployment tunes and draws
  (``TILETUNE_MAX_TOKENS``, ``_MAX_HEADS``, ``_MAX_HEAD_CLASSES``, ``_MAX_BATCH``) gets a
  422 whose message names the field, the value and the variable.
- :func:`validation_report`: a body that fails validation is answered with its first
  :data:`MAX_REPORTED_ERRORS` problems and the count of the rest, never an echo of the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import HTTPException
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from kernel.workload import Workload
from server.settings import Settings

MAX_REPORTED_ERRORS = 10
MAX_REPORTED_CHARS = 300  # of one problem's text: a rule, never a copy of the input
# Structural characters a valid body may hold: per head at most '{', 5 ':' and 5 ','
# (11, rounded up), and for everything else (layout, versions, job fields, and commas
# or colons inside the bounded strings) far fewer than the base.
JSON_STRUCTURE_PER_HEAD = 12
JSON_STRUCTURE_BASE = 512
STRUCTURAL = (b"{", b"[", b",", b":")


def max_json_structure(settings: Settings) -> int:
    """Structural characters (``{ [ , :``) a JSON body may hold: the most a workload of
    ``TILETUNE_MAX_HEADS`` heads needs."""
    return JSON_STRUCTURE_PER_HEAD * settings.max_heads + JSON_STRUCTURE_BASE


class BodyLimits:
    """413 for a body over ``max_bytes`` (declared or streamed), or a JSON body with more than
    ``max_structure`` structural characters; the body is read once and replayed to the app."""

    def __init__(self, app: Any, max_bytes: int, max_structure: int, max_heads: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_structure = max_structure
        self.max_heads = max_heads

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await _refuse(send, f"body: larger than the {self.max_bytes}-byte limit (TILETUNE_MAX_BODY_BYTES)")
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await _refuse(send, f"body: larger than the {self.max_bytes}-byte limit (TILETUNE_MAX_BODY_BYTES)")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and _is_json(headers.get(b"content-type")):
            structure = sum(body.count(c) for c in STRUCTURAL)
            if structure > self.max_structure:
                await _refuse(
                    send,
                    f"body: {structure} JSON structural characters ('{{', '[', ',', ':') > {self.max_structure}, "
                    f"the most a workload of TILETUNE_MAX_HEADS={self.max_heads} heads needs",
                )
                return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _is_json(content_type: bytes | None) -> bool:
    """What FastAPI parses as JSON: no content type, ``application/json`` or ``application/*+json``."""
    if not content_type:
        return True
    mime = content_type.split(b";", 1)[0].strip().lower()
    return mime == b"application/json" or (mime.startswith(b"application/") and mime.endswith(b"+json"))


async def _refuse(send: Any, message: str) -> None:
    body = JSONResponse({"detail": "request body too large", "message": message}, 413)
    await body({"type": "http"}, _no_receive, send)


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def check_workload(workload: Workload, settings: Settings, *, preset: bool) -> None:
    """422 unless ``workload`` is within the deployment's limits; the message names the field
    (``workload.preset`` for a preset's pattern), the value and the ``TILETUNE_*`` variable."""
    pattern = workload.pattern
    where = "workload.preset" if preset else "workload.pattern"
    heads_field = "workload.heads" if preset else "workload.pattern.heads"
    checks = (
        (pattern.seq_len, settings.max_tokens, "TILETUNE_MAX_TOKENS", where, "tokens"),
        (pattern.num_heads, settings.max_heads, "TILETUNE_MAX_HEADS", heads_field, "heads"),
        (len(pattern.classes()), settings.max_head_classes, "TILETUNE_MAX_HEAD_CLASSES", heads_field,
         "distinct head patterns"),
        (workload.batch, settings.max_batch, "TILETUNE_MAX_BATCH", "workload.batch", "batch"),
    )  # fmt: skip
    for value, limit, variable, field, what in checks:
        if value > limit:
            raise HTTPException(422, f"{field}: {value} {what} > the limit {variable}={limit}")


def limits_description(settings: Settings) -> str:
    """The limits of this deployment, for the OpenAPI document's description (markdown)."""
    rows = [
        ("TILETUNE_MAX_TOKENS", settings.max_tokens, "tokens of a workload (frames x tokens_per_frame + text)"),
        ("TILETUNE_MAX_HEADS", settings.max_heads, "heads of a workload"),
        ("TILETUNE_MAX_HEAD_CLASSES", settings.max_head_classes, "distinct head patterns of a workload"),
        ("TILETUNE_MAX_BATCH", settings.max_batch, "batch of a workload"),
        ("TILETUNE_MAX_BODY_BYTES", settings.max_body_bytes, "bytes of a request body"),
        ("(derived)", max_json_structure(settings), "JSON structural characters { [ , : of a body"),
    ]
    lines = ["| limit | value | of |", "|---|---|---|"]
    lines += [f"| `{name}` | {value:,} | {what} |" for name, value, what in rows]
    return (
        "\n\nLimits of this deployment (a workload over one gets a 422 naming it; a body over one a 413):\n\n"
        + "\n".join(lines)
    )


def validation_report(errors: Sequence[Any]) -> JSONResponse:
    """The 422 of a request that failed validation: its first :data:`MAX_REPORTED_ERRORS` problems
    (the field and the rule; the offending input is never echoed) and how many more there were."""
    shown = [{k: v for k, v in err.items() if k != "input"} for err in errors[:MAX_REPORTED_ERRORS]]
    encoded = [_clipped(err) for err in jsonable_encoder(shown, custom_encoder={Exception: str})]
    parts = []
    for err in encoded:
        if err.get("type") == "json_invalid":  # loc is ("body", <character offset>)
            offset = err.get("loc", ("body", "?"))[-1]
            parts.append(f"body: invalid JSON at character {offset}: {err.get('ctx', {}).get('error', '')}")
            continue
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = len(errors) - len(shown)
    message = "; ".join(parts) + (f"; and {more} more problem(s)" if more > 0 else "")
    return JSONResponse({"detail": encoded, "errors": len(errors), "message": message}, 422)


def _clipped(value: Any) -> Any:
    """``value`` with every string cut to :data:`MAX_REPORTED_CHARS`."""
    if isinstance(value, str):
        return value if len(value) <= MAX_REPORTED_CHARS else value[:MAX_REPORTED_CHARS] + "..."
    if isinstance(value, dict):
        return {k: _clipped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clipped(v) for v in value]
    return value

"""``tiletune lookup``, ``configs`` and ``history``: questions to the HTTP API.

They speak the API to a running server with ``--server URL``, or in-process to the
database (``--database-url`` / ``TILETUNE_DATABASE_URL``), so both paths give the
same answers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from server.cli.common import DatabaseOpt, JsonOpt, err, fail, out, speedups
from server.cli.common import settings as settings_of

ServerOpt = Annotated[str | None, typer.Option("--server", help="Query this server (e.g. http://127.0.0.1:8000)")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="TILETUNE_TOKEN", help="Bearer token")]


def _request(
    method: str,
    path: str,
    server: str | None,
    database_url: str | None,
    token: str | None,
    body: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    params = {k: v for k, v in (params or {}).items() if v is not None}
    if server:
        with httpx.Client(base_url=server, timeout=30) as client:
            return client.request(method, path, json=body, params=params, headers=headers)
    from server.api.app import create_app

    app = create_app(settings_of(database_url))

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tiletune") as client:
            response = await client.request(method, path, json=body, params=params, headers=headers)
            await response.aread()
            return response

    try:
        return asyncio.run(call())
    finally:
        app.state.db.dispose()


def _ask(
    method: str,
    path: str,
    server: str | None,
    database_url: str | None,
    token: str | None,
    body: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The API's JSON answer; an error answer exits 2 with its message."""
    return _answer(_request(method, path, server, database_url, token, body, params))


def _answer(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = {"message": response.text}
    if response.status_code >= 400:
        err.print(f"[red]error {response.status_code}:[/red] {data.get('message', data)}")
        raise typer.Exit(2)
    return data


def lookup(
    preset: Annotated[str | None, typer.Option(help="Workload preset")] = None,
    workload: Annotated[str | None, typer.Option(help="Workload JSON file (the API's workload object)")] = None,
    device_kind: Annotated[str, typer.Option(help="Device kind, e.g. 'TPU v6 lite' or 'cpu'")] = "cpu",
    backend: Annotated[str, typer.Option(help="tpu | xla | interpret")] = "xla",
    dtype: Annotated[str | None, typer.Option(help="float32 | bfloat16 (default: the preset's)")] = None,
    enqueue: Annotated[bool, typer.Option(help="Queue a tuning job on a miss (needs a writer token)")] = False,
    snapshot: Annotated[
        int | None, typer.Option(min=0, help="Answer as of this snapshot (the 'snapshot' of an earlier answer)")
    ] = None,
    server: ServerOpt = None,
    database_url: DatabaseOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Look up the tuned config of a workload."""
    if (preset is None) == (workload is None):
        raise typer.BadParameter("give exactly one of --preset or --workload")
    if workload is not None:
        try:
            with open(workload) as fh:
                spec = json.load(fh)
        except (OSError, ValueError) as exc:  # the server names a wrong field; a file it never sees is named here
            raise fail(f"--workload {workload}: {exc}") from None
    else:
        from kernel.presets import PRESETS

        if preset not in PRESETS:
            raise typer.BadParameter(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        spec = {
            "device_kind": device_kind,
            "backend": backend,
            "dtype": dtype or PRESETS[preset].dtype,
            "preset": preset,
        }
    from autotune.versions import software_versions

    versions = software_versions(backend)
    data = _ask(
        "POST",
        "/v1/lookup",
        server,
        database_url,
        token,
        {"workload": spec, "versions": versions, "enqueue": enqueue, "snapshot": snapshot},
    )
    if as_json:
        print(json.dumps(data, indent=2))
        return
    console = out()
    console.print(f"workload {data['workload_key']}: [bold]{data['source']}[/bold]")
    cfg = data["config"]
    console.print("config: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
    if data.get("timing"):
        t = data["timing"]
        speed = speedups(t["median_ms"], t.get("dense_ms"), t.get("tiled_dense_ms"), p10_p90=t.get("speedup_p10_p90"))
        console.print(f"median {t['median_ms']:.3f} ms (p10 {t['p10_ms']}, p90 {t['p90_ms']}){speed}")
    if data.get("distance") is not None:
        console.print(f"nearest tuned workload {data['neighbour_key']} at distance {data['distance']}")
    if data.get("job_id"):
        console.print(f"tuning job {data['job_id']} queued")
    console.print(f"snapshot {data['snapshot']} (pin a run to these answers with TILETUNE_SNAPSHOT={data['snapshot']})")


def configs(
    device_kind: Annotated[str | None, typer.Option()] = None,
    backend: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    server: ServerOpt = None,
    database_url: DatabaseOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the current tuned configs."""
    data = _ask(
        "GET",
        "/v1/configs",
        server,
        database_url,
        token,
        params={"device_kind": device_kind, "backend": backend, "limit": limit},
    )
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table("id", "workload", "config", "median ms", "speedup", "jax")
    for item in data["items"]:
        c, t = item["config"], item["timing"]
        table.add_row(
            str(item["id"]),
            item["workload_key"],
            f"{c['variant']} q{c['block_q']} kv{c['block_kv']} {c['layout']} {c['align']}",
            f"{t['median_ms']:.3f}",
            f"{t['speedup']:.2f}x" if t.get("speedup") else "-",
            item["versions"]["jax"],
        )
    out().print(table)


def history(
    key: Annotated[str, typer.Argument(help="Workload key")],
    status: Annotated[str | None, typer.Option(help="Only trials with this status")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    server: ServerOpt = None,
    database_url: DatabaseOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Trials of one workload, newest first."""
    data = _ask(
        "GET",
        f"/v1/workloads/{key}/history",
        server,
        database_url,
        token,
        params={"status": status, "limit": limit},
    )
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table("trial", "status", "params", "compile ms", "median ms", "max err", "error")
    for t in data["items"]:
        p = t["params"]
        table.add_row(
            str(t["id"]),
            t["status"],
            f"{p.get('variant')} q{p.get('block_q')} kv{p.get('block_kv')}",
            f"{t['compile_ms']:.0f}" if t["compile_ms"] is not None else "-",
            f"{t['median_ms']:.3f}" if t["median_ms"] is not None else "-",
            f"{t['max_error']:.1e}" if t["max_error"] is not None else "-",
            (t["error"] or "")[:60],
        )
    out().print(table)

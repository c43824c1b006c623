"""The service as one ASGI app: the JSON API with the ``/ui`` dashboard mounted beside it.

The composition root: the API (:mod:`server.api`) and the dashboard
(:mod:`server.dashboard`) do not import each other; this module puts their routers
in one app, which ``tiletune serve`` runs under uvicorn (``server.app:create_app``).
"""

from __future__ import annotations

from fastapi import FastAPI

from server.api import app as api
from server.dashboard import routes as dashboard
from server.settings import Settings
from server.store.db import Database


def create_app(settings: Settings | None = None, database: Database | None = None) -> FastAPI:
    """The service on ``settings`` (default: the ``TILETUNE_*`` variables) and ``database``
    (default: a new one at ``settings.database_url``)."""
    return api.create_app(settings, database, routers=[dashboard.router])

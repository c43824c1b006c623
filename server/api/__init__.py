"""The HTTP API (FastAPI): :func:`server.api.app.create_app` wires settings, the database,
error handlers and middleware around module-level routers, one per concern."""

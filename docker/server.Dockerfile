# The tiletune API server (also runs the migrations: `tiletune db upgrade`).
# Build from the repository root: docker build -f docker/server.Dockerfile -t tiletune-server .
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY kernel ./kernel
COPY autotune ./autotune
COPY server ./server
COPY migrations ./migrations
RUN pip install --no-cache-dir .

ENV TILETUNE_DATABASE_URL=postgresql+psycopg://tiletune:tiletune@postgres:5432/tiletune
EXPOSE 8000
CMD ["tiletune", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-migrate"]

# A tuning worker for a Cloud TPU VM: JAX with libtpu (the `tpu` extra).
# Build from the repository root: docker build -f docker/worker-tpu.Dockerfile -t tiletune-worker-tpu .
# Run on the TPU VM (the container needs the TPU devices and the host network):
#   docker run --rm --privileged --net=host -e TILETUNE_DATABASE_URL=postgresql+psycopg://... tiletune-worker-tpu
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY kernel ./kernel
COPY autotune ./autotune
COPY server ./server
COPY migrations ./migrations
RUN pip install --no-cache-dir '.[tpu]'

# SIGTERM (docker stop) finishes the trial in flight and gives the job back.
STOPSIGNAL SIGTERM
CMD ["tiletune", "worker", "--backend", "tpu"]

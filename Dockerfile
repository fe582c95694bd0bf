# One image for every corral role in the `production` compose profile (docker-compose.yml); the command picks the
# role (corral-harness, corral-model, corral-sandbox, corral-proxy, corral-utility-hand, corral-stream,
# corral-gateway). Built where a registry is reachable; the `offline` profile builds images/corral/Dockerfile
# from the local Debian base instead (python -m deploy build).
FROM python:3.11-slim
RUN useradd --create-home --uid 10001 corral
WORKDIR /app
COPY pyproject.toml README.md ./
COPY corral ./corral
COPY workflows ./workflows
COPY activities ./activities
COPY workers ./workers
COPY proxy ./proxy
COPY cli ./cli
COPY gateway ./gateway
# The s3 extra: the production profile keeps long sessions' blobs in the S3-compatible store (MinIO).
RUN pip install --no-cache-dir ".[s3]"
USER corral
CMD ["corral-all-in-one"]

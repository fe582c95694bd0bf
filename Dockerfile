# One image for every corral role; the command picks the role (corral-harness, corral-model, corral-utility-hand).
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
RUN pip install --no-cache-dir .
USER corral
CMD ["corral-all-in-one"]

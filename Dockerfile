# The contextcore image: one image for every consumer and the schema commands.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
# The two distributions that ship (packaging/README.md): the client (schemas, broker, producers)
# and the service (contextcore, consumers, admin) with its encoders. devstack/ (the embedded
# broker and database, the demo) stays out: production never imports it.
COPY pyproject.toml README.md ./
COPY packaging/client ./packaging/client
COPY schemas ./schemas
COPY broker ./broker
COPY producers ./producers
COPY contextcore ./contextcore
COPY consumers ./consumers
COPY admin ./admin
# torch first, as its CPU build (PyPI's default wheel is the CUDA build, several GB)
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir ./packaging/client '.[encoders]' \
    && useradd --system --uid 10001 contextcore
# exported OpenVINO models are cached here (mount a volume to keep them across restarts)
ENV CONTEXTCORE_KNOWLEDGE_CACHE_DIR=/tmp/contextcore-models HF_HUB_OFFLINE=1
USER contextcore
EXPOSE 9464 9465 9466 9467 9468
CMD ["contextcore", "serve", "build"]

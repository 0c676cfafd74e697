# The contextcore image: one image for every consumer and the schema commands.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
# devstack/ (the embedded broker and database, the demo) stays out: production never imports it.
COPY contextcore ./contextcore
COPY schemas ./schemas
COPY broker ./broker
COPY consumers ./consumers
COPY producers ./producers
RUN pip install --no-cache-dir . && useradd --system --uid 10001 contextcore
USER contextcore
EXPOSE 9464
CMD ["contextcore", "serve", "build"]

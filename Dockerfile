# The contextcore image: one image for every consumer and the schema commands.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY contextcore ./contextcore
COPY schemas ./schemas
COPY consumers ./consumers
COPY producers ./producers
RUN pip install --no-cache-dir . && useradd --system --uid 10001 contextcore
USER contextcore
EXPOSE 9464
CMD ["contextcore", "serve", "build"]

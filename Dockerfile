# The callproof gateway image (compose.yaml builds it for the `migrate` and `gateway` services).
# CPU-only: with --engine vllm the gateway does no decoding itself, the vLLM service does.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    CALLPROOF_DATA_DIR=/data \
    CALLPROOF_MODEL_CACHE=/cache \
    CALLPROOF_HOST=0.0.0.0 \
    CALLPROOF_PORT=8000

WORKDIR /app
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY callproof ./callproof
COPY runtime ./runtime
COPY receipts ./receipts
COPY gateway ./gateway
COPY migrations ./migrations
# The gateway and Postgres extras only: the embedded engine's libraries (torch, transformers:
# about 1 GB) are for laptops and tests; this image serves in front of vLLM. Every dependency
# at the version constraints.txt locks, the one the suite passed with.
RUN pip install -c constraints.txt ".[gateway,postgres]" \
    && useradd --system --uid 10001 --home-dir /data callproof \
    && mkdir -p /data /cache && chown callproof /data /cache && chmod 0700 /data

USER callproof
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --retries=6 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]
ENTRYPOINT ["callproof"]
CMD ["serve"]

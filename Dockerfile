# The callproof gateway image (compose.yaml builds it for the `migrate` and `gateway` services).
# CPU-only: with --engine vllm the gateway does no decoding itself, the vLLM service does.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    CALLPROOF_DATA_DIR=/data \
    CALLPROOF_HOST=0.0.0.0 \
    CALLPROOF_PORT=8000

WORKDIR /app
# torch first, pinned, from the CPU wheel index: from PyPI an unpinned or plain torch is a
# multi-GB CUDA build that this image never uses.
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY callproof ./callproof
COPY runtime ./runtime
COPY receipts ./receipts
COPY gateway ./gateway
COPY migrations ./migrations
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /data callproof \
    && mkdir -p /data && chown callproof /data

USER callproof
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --retries=6 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]
ENTRYPOINT ["callproof"]
CMD ["serve"]

# ctxproxy as a sidecar: slim base, non-root, tokenizer files baked in (no egress needed).
FROM python:3.11-slim

# Where the image was built from: `docker build --build-arg CTXPROXY_SOURCE=<repository URL> .`
ARG CTXPROXY_SOURCE=""
# OCI annotations; version and licenses match pyproject.toml (tests/test_container.py checks).
LABEL org.opencontainers.image.title="ctxproxy" \
      org.opencontainers.image.description="OpenAI-compatible proxy that manages an agent's context window in transit" \
      org.opencontainers.image.source="${CTXPROXY_SOURCE}" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="0.1.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TIKTOKEN_CACHE_DIR=/opt/ctxproxy/tiktoken \
    CTXPROXY_HOST=0.0.0.0 \
    CTXPROXY_PORT=8080 \
    CTXPROXY_STORE=sqlite:////data/ctxproxy.db

WORKDIR /app
COPY pyproject.toml README.md config.yaml ./
COPY proxy ./proxy
# Same install step as CI's (`pip install .`), then verify and seed the shipped
# encodings into TIKTOKEN_CACHE_DIR so the container never downloads them.
RUN pip install --no-cache-dir . && python -m proxy.tokens.encodings \
 && groupadd --system --gid 10001 ctxproxy \
 && useradd --system --uid 10001 --gid 10001 --home-dir /data ctxproxy \
 && mkdir -p /data && chown 10001:10001 /data

# Numeric, so Kubernetes' runAsNonRoot can tell it is not root.
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8080
# Config: mount a file and set CTXPROXY_CONFIG, or use the CTXPROXY_* variables.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD python -c "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CTXPROXY_PORT','8080'), timeout=2)" || exit 1
# Exec form: ctxproxy is PID 1 and gets SIGTERM itself (no shell in between); uvicorn then stops
# accepting, lets in-flight requests and streams finish (up to 30 s: give `docker stop -t 35`), then exits.
STOPSIGNAL SIGTERM
CMD ["ctxproxy", "serve"]

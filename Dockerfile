# ctxproxy as a sidecar: slim base, non-root, tokenizer files baked in (no egress needed).
FROM python:3.11-slim

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
 && useradd --system --uid 10001 --home-dir /data ctxproxy \
 && mkdir -p /data && chown ctxproxy /data

USER ctxproxy
VOLUME ["/data"]
EXPOSE 8080
# Config: mount a file and set CTXPROXY_CONFIG, or use the CTXPROXY_* variables.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD python -c "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CTXPROXY_PORT','8080'), timeout=2)" || exit 1
CMD ["ctxproxy", "serve"]

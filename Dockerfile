# mathdebate: the env server image (default) and, with --build-arg EXTRAS=train, the trainer.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY env_server ./env_server
COPY trainer_client ./trainer_client
RUN pip install --upgrade pip \
 && if [ -n "$EXTRAS" ]; then pip install ".[${EXTRAS}]"; else pip install .; fi

# Non-root user; grading workers inherit it. /outputs and /cache are where docker-compose.yml
# mounts named volumes: a fresh named volume takes this ownership, so the user can write there.
RUN useradd --create-home --uid 1000 debate \
 && mkdir -p /outputs /cache/huggingface /state \
 && chown -R debate:debate /outputs /cache /state
USER debate

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status == 200 else 1)"
CMD ["mathdebate", "serve", "--host", "0.0.0.0", "--port", "8000"]

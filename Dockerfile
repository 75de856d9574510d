# mathdebate: the env server image (default) and, with --build-arg EXTRAS=train, the trainer.
#
# BASE_IMAGE: any Debian-like Python 3.11+ image with `python` and `pip` on PATH (the default is
# the official slim image; scripts/check_compose.sh passes a stand-in built from Debian packages).
# TORCH_PIP_ARGS (trainer only): how pip installs torch before the rest. Empty (the default): torch
# comes with the `train` extra from the package index, which on Linux x86_64 is the CUDA build GPU
# users need. Otherwise these are pip arguments naming torch and where it comes from, e.g. a CPU
# image from PyTorch's CPU wheel index: `--index-url <that index> torch`; the compose check uses
# `--find-links <a local folder served over HTTP> torch==2.13.0+cpu`, so it never downloads a CUDA
# build (the `train` extra's torch range then installs nothing more).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS deps

ARG EXTRAS=""
ARG TORCH_PIP_ARGS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
# The dependencies first, read from pyproject.toml (tomllib: Python 3.11+), in their own layer, so
# that a change to the code rebuilds only the last, small layer.
COPY pyproject.toml README.md ./
RUN pip install --upgrade pip \
 && if [ -n "$TORCH_PIP_ARGS" ]; then pip install $TORCH_PIP_ARGS; fi \
 && python -c "import os, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = [e for e in os.environ.get('EXTRAS', '').split(',') if e]; \
print('\n'.join(p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The package, as a wheel built in a stage of its own. MYPYC=1 (the default) compiles the env
# server's hot path with mypyc (setup.py; about 0.8x the server CPU per step, benchmarks/README.md
# "Compiled hot path"); the C compiler and mypy stay in this stage, out of the image. MYPYC=0: a
# pure-Python wheel (docker-compose.yml builds the trainer so: it serves nothing).
FROM deps AS wheel
ARG MYPYC=1
RUN if [ "$MYPYC" = 1 ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends gcc libc6-dev \
      && { python -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
           || apt-get install -y --no-install-recommends python3-dev; } \
      && rm -rf /var/lib/apt/lists/* \
      && pip install "mypy==2.4.1" "setuptools>=77" wheel; \
    fi
COPY setup.py ./
COPY env_server ./env_server
COPY trainer_client ./trainer_client
RUN if [ "$MYPYC" = 1 ]; then MATHDEBATE_MYPYC=1 pip wheel --no-deps --no-build-isolation . -w /wheels; \
    else pip wheel --no-deps . -w /wheels; fi

FROM deps
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels

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

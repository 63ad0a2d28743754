# StreamRec's four CPU images, one target each (api, sampler, embedding-store, trainer), built
# from the repository root:
#   docker build --target <name> -t streamrec-<name>:0.1.0 .
# (`make images` builds them all, and the two of Dockerfile.gpu.) The targets share one
# builder and one runtime stage, so a build cache holds those once for the four images; a
# target adds only its own settings. The one wheel carries every service.

# --- builder: the project, C++ extensions compiled, installed into /opt/venv ---
FROM python:3.11-slim-bookworm AS builder
# Debian point releases move the package versions: the base image tag is pinned instead.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first: the CPU build that pyproject pins (PyPI's default is a multi-GB CUDA build);
# then setup.py's build tools, since the extensions compile against this very torch
# (--no-build-isolation).
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir setuptools==84.2.1 wheel==0.48.0 ninja==1.13.2
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY services ./services
RUN pip install --no-cache-dir --no-build-isolation . \
    && pip uninstall -y ninja

# --- runtime: the venv alone, no compiler; the base of every target below ---
FROM python:3.11-slim-bookworm AS runtime
# libgomp1: the OpenMP runtime the C++ extensions link; /data: the store's checkpoints and the
# trainer's data, a volume mount point the user owns (an empty folder in the other images).
# Debian point releases move the package versions: the base image tag is pinned instead.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 streamrec \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin streamrec \
    && install -d -o 10001 -g 10001 /data
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# --- api: the control plane, REST API and scheduler ---
#   docker build --target api -t streamrec-api:0.1.0 .
# Run it with the token as a mounted secret file, pointed at Redis:
#   docker run -p 8000:8000 -v $PWD/api-token:/run/secrets/api-token:ro \
#     -e STREAMREC_API_REDIS_URL=redis://redis:6379/0 \
#     -e STREAMREC_API_DATA_ROOTS=/data -e STREAMREC_API_MODEL_ROOTS=/models streamrec-api:0.1.0
# The API imports torch only to validate trainer configs.
FROM runtime AS api
# Settings come from STREAMREC_API_* (flags win): listen on every address of the container.
ENV STREAMREC_API_HOST=0.0.0.0 \
    STREAMREC_API_PORT=8000
# The path of the mounted Secret that holds the token, not the token itself.
# hadolint ignore=DL3064
ENV STREAMREC_API_TOKEN_FILE=/run/secrets/api-token
USER 10001:10001
EXPOSE 8000
# /healthz answers while the process serves (Redis is /readyz's business).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('STREAMREC_API_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["streamrec-api"]
CMD ["serve"]

# --- sampler: the node-local sampler (a Kubernetes DaemonSet, reached through a Service with
# internalTrafficPolicy: Local) ---
#   docker build --target sampler -t streamrec-sampler:0.1.0 .
#   docker run -v $PWD/peer-token:/run/secrets/streamrec-peer-token:ro -p 5560:5560 \
#     streamrec-sampler:0.1.0
# `docker run ... streamrec-sampler:0.1.0 ping --endpoint tcp://HOST:5560` asks a server.
FROM runtime AS sampler
# The path of the mounted Secret that holds the peer token (streamrec.auth), not the token.
# hadolint ignore=DL3064
ENV STREAMREC_AUTH_TOKEN_FILE=/run/secrets/streamrec-peer-token
USER 10001:10001
# 5560: ZeroMQ requests; 9102: Prometheus /metrics
EXPOSE 5560 9102
# ZeroMQ has no HTTP probe: the check asks the /metrics listener of the same process, on the
# port CMD passes (a CMD without --metrics-port needs --no-healthcheck).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9102/metrics', timeout=2)"]
ENTRYPOINT ["streamrec-sampler"]
CMD ["serve", "--endpoint", "tcp://0.0.0.0:5560", \
     "--metrics-port", "9102", "--metrics-host", "0.0.0.0"]

# --- embedding-store: one embedding-store shard (CPU: host or ssd tier) ---
#   docker build --target embedding-store -t streamrec-embedding-store:0.1.0 .
# Shard K of N: in a StatefulSet `--shard-id from-hostname` takes K from the pod name
# "<name>-K" (with docker run, give --hostname store-0); the tables file is mounted
# (ConfigMap), checkpoints go to /data (a shared volume):
#   docker run --hostname store-0 -v $PWD/tables.yaml:/etc/streamrec/tables.yaml:ro \
#     -v $PWD/peer-token:/run/secrets/streamrec-peer-token:ro -p 5555:5555 \
#     streamrec-embedding-store:0.1.0
FROM runtime AS embedding-store
# The path of the mounted Secret that holds the peer token (streamrec.auth), not the token.
# hadolint ignore=DL3064
ENV STREAMREC_AUTH_TOKEN_FILE=/run/secrets/streamrec-peer-token
USER 10001:10001
# 5555: ZeroMQ requests; 9100: Prometheus /metrics
EXPOSE 5555 9100
# ZeroMQ has no HTTP probe: the check asks the /metrics listener of the same process, on the
# port CMD passes (a CMD without --metrics-port needs --no-healthcheck).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/metrics', timeout=2)"]
ENTRYPOINT ["streamrec-embedding-store"]
CMD ["serve", "--shard-id", "from-hostname", "--num-shards", "1", \
     "--endpoint", "tcp://0.0.0.0:5555", "--tables", "/etc/streamrec/tables.yaml", \
     "--model-root", "/data", "--metrics-port", "9100", "--metrics-host", "0.0.0.0"]

# --- trainer: a trainer rank (CPU, gloo between ranks) run by the control plane: the agent
# takes the job's passes from the API's Redis ---
#   docker build --target trainer -t streamrec-trainer:0.1.0 .
# One pod is one rank: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from the environment
# (env:// rendezvous; a StatefulSet takes RANK from the pod ordinal). The job is an argument:
#   docker run -v $PWD/peer-token:/run/secrets/streamrec-peer-token:ro -v $PWD/data:/data \
#     streamrec-trainer:0.1.0 --redis-url redis://redis:6379/0 --job-id JOB
# The job-file trainer is in the image too: --entrypoint streamrec-trainer.
FROM runtime AS trainer
# A rank owns its pod's cores: its OpenMP threads (the step's gemms) spin between regions
# instead of StreamRec's default PASSIVE, which costs 4% (setup b) to 40% (setup a) of the
# step (BENCHMARKS.md, "Fair baseline").
ENV OMP_WAIT_POLICY=ACTIVE
# The path of the mounted Secret that holds the peer token (streamrec.auth), not the token.
# hadolint ignore=DL3064
ENV STREAMREC_AUTH_TOKEN_FILE=/run/secrets/streamrec-peer-token
USER 10001:10001
# 29500: torch.distributed rendezvous (MASTER_PORT on rank 0); 9200: Prometheus /metrics
EXPOSE 29500 9200
# No HEALTHCHECK: /metrics comes up only once the rank has read its job from Redis and met
# its group, which may take long; the agent's liveness is its heartbeat to the API (a rank
# stuck past --stuck-timeout-s exits with code 4).
# The metrics flags sit in ENTRYPOINT so that the job's arguments (CMD, or a pod's args) add
# to them; a later --metrics-port among those arguments wins.
ENTRYPOINT ["streamrec-trainer-agent", "--metrics-port", "9200", "--metrics-host", "0.0.0.0"]

# The registry: `registry serve` (gRPC sync on 50051, Prometheus /metrics on 9300) over the SQLite
# catalog and blob store in REGISTRY_HOME (a volume).
#
#   docker compose build registry       (or: docker build -f docker/registry.Dockerfile -t tiered/registry .)
#
# This is the full install, with a CPU-only torch: `registry serve` itself never imports torch,
# but `registry publish` validates the models, exports the edge to ONNX and quantizes it, which
# needs torch, onnx, onnxscript and onnxruntime. Having them here lets a release be published
# from inside the stack:
#   docker compose exec registry registry publish /release --name sentiment
# The CPU wheel (~200 MB instead of several GB of CUDA libraries) comes from PyTorch's own index;
# pass --build-arg TORCH_INDEX_URL=https://pypi.org/simple to take PyPI's (CUDA) build instead.
FROM python:3.11-slim-bookworm

# A page or folder of wheels pip may also take torch from (a local mirror, a CPU wheel at hand):
# a local 2.13.0+cpu wins over the index's 2.13.0. Empty: the index alone.
ARG TORCH_FIND_LINKS=
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# torch alone first (its own cached layer). 2.13.0+cpu satisfies the project's torch==2.13.0.
RUN pip install --index-url "$TORCH_INDEX_URL" ${TORCH_FIND_LINKS:+--find-links "$TORCH_FIND_LINKS"} \
    torch==2.13.0

COPY . /src
RUN pip install /src && rm -rf /src \
    && python -c "import registry.cli.main, registry.server.app, registry.server.service" && registry --help >/dev/null

# Every folder a volume is mounted on for writing, made here and owned by `tiered`: an empty named
# volume takes the image's folder (owner included) on first use, while a folder the image lacks
# is created root-owned, and the non-root service cannot write into it.
RUN useradd --system --create-home --uid 10001 tiered \
    && mkdir -p /var/lib/tiered/registry /var/lib/tiered/release-key /var/lib/tiered/keys \
       /var/lib/tiered/fleet-ca \
    && chown -R tiered /var/lib/tiered
USER tiered
WORKDIR /home/tiered

ENV REGISTRY_HOST=0.0.0.0 REGISTRY_GRPC_PORT=50051 REGISTRY_METRICS_PORT=9300 \
    REGISTRY_HOME=/var/lib/tiered/registry
EXPOSE 50051 9300
CMD ["registry", "serve"]

# The edge tier: CPU only, serves the INT8 ONNX model through onnxruntime and escalates unsure
# rows to a center. No torch in this image: the project is installed --no-deps and
# docker/edge-requirements.txt lists exactly what `edge` and its sync client import.
#
#   docker compose build edge-eu        (or: docker build -f docker/edge.Dockerfile -t tiered/edge .)
#
# Settings are EDGE_* variables (see README / `edge --help`); the model store starts empty and
# is filled by sync from `registry serve` (EDGE_REGISTRY or Consul).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# Third-party dependencies first: this layer is rebuilt only when the requirements change.
# Then, in the same layer (a later one would not shrink the image), what those packages pull
# in but the edge never imports: litestar's test-data factories (polyfactory, faker: 27 MB) and
# the tokenizers' hub client (huggingface-hub, hf-xet, fsspec: 21 MB; models come from the
# store, never from a hub). The import checks below fail the build if one of them is needed.
COPY docker/edge-requirements.txt /tmp/edge-requirements.txt
RUN pip install -r /tmp/edge-requirements.txt \
    && pip uninstall -y -q polyfactory faker huggingface-hub hf-xet fsspec \
    && rm /tmp/edge-requirements.txt

# The project itself, without its dependencies (which would pull torch). The import check fails
# the build if the edge ever starts importing something the requirements file lacks, and the
# last test fails it if torch slipped in.
COPY . /src
RUN pip install --no-deps /src && rm -rf /src \
    && python -c "import edge.cli, serving.fleet.discovery, serving.transport.rpc, serving.telemetry.tracing, sync.node.subscriber" \
    && python -c "import opentelemetry.exporter.otlp.proto.grpc.trace_exporter" \
    && edge --help >/dev/null \
    && ! python -c "import torch" 2>/dev/null

RUN useradd --system --create-home --uid 10001 tiered \
    && mkdir -p /var/lib/tiered/edge && chown -R tiered /var/lib/tiered
USER tiered
WORKDIR /home/tiered

ENV EDGE_HOST=0.0.0.0 EDGE_PORT=8200 EDGE_STORE=/var/lib/tiered/edge
EXPOSE 8200 8201
CMD ["edge"]

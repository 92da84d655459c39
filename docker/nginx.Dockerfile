# The entry point: nginx (Debian's nginx-light) in front of the healthy edges, run as a child of
# the upstream renderer `python -m nginx.render`, which writes nginx.conf from the template in
# the `nginx` package, watches Consul, rewrites the upstream list and reloads nginx.
# The same image runs Prometheus's target renderer (`python -m tiered.monitoring.targets`, the
# prometheus-targets service): the same Consul watches, into file_sd files under
# /var/lib/tiered/targets.
#
#   docker compose build nginx          (or: docker build -f docker/nginx.Dockerfile -t tiered/nginx .)
#
# The renderer needs no torch and no onnxruntime, so the project is installed --no-deps next to
# the few packages it imports (docker/nginx-requirements.txt).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light \
    && rm -rf /var/lib/apt/lists/*

# What `nginx.render` imports besides the stdlib and the project (docker/nginx-requirements.txt).
COPY docker/nginx-requirements.txt /tmp/nginx-requirements.txt
RUN pip install -r /tmp/nginx-requirements.txt && rm /tmp/nginx-requirements.txt

# The entry's and the side's *.conf.template ship as package data (pyproject.toml); the checks
# fail the build without them.
COPY . /src
RUN pip install --no-deps /src \
    && rm -rf /src \
    && python -c "import nginx.entry as e, nginx.side as s; assert e.TEMPLATE.is_file() and s.TEMPLATE.is_file()" \
    && python -m nginx.render --help >/dev/null \
    && python -m tiered.monitoring.targets --help >/dev/null

# nginx runs unprivileged (-p PREFIX, temp paths under it); the two folders below are where it
# looks before reading its configuration (error log, default temp paths).
RUN useradd --system --create-home --uid 10001 tiered \
    && mkdir -p /var/lib/tiered/nginx /var/lib/tiered/targets \
    && chown -R tiered /var/lib/tiered /var/log/nginx /var/lib/nginx
USER tiered
WORKDIR /home/tiered

EXPOSE 8080 8081
CMD ["python", "-m", "nginx.render", "--prefix", "/var/lib/tiered/nginx", \
     "--listen", "0.0.0.0:8080", "--grpc-listen", "0.0.0.0:8081", "--consul", "consul:8500", \
     "--run-nginx"]

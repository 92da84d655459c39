# Prometheus and Alertmanager for the containers (docker-compose.yml, deploy/swarm/stack.yml):
# Debian bookworm's packages, the same versions `tiered up` runs, with the repository's
# monitoring/ folder (alert and recording rules, the receivers, each deployment's Prometheus
# configuration) under /etc/tiered/monitoring. One image, two services: `prometheus` and
# `prometheus-alertmanager` (Debian's name). Their targets come from the `prometheus-targets`
# service (the nginx image: `python -m tiered.monitoring.targets`), never from this image.
#
#   docker compose build prometheus     (or: docker build -f docker/monitoring.Dockerfile -t tiered/monitoring .)
#
# The official python image is only the Debian base the other images share (its Python runs the
# health checks); nothing of the project is installed here. A change to the rules or receivers
# takes a rebuild: docker compose up -d --build prometheus alertmanager.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       prometheus prometheus-alertmanager \
    && rm -rf /var/lib/apt/lists/*

# The build fails on a configuration or rule file Prometheus or Alertmanager would refuse.
COPY monitoring /etc/tiered/monitoring
RUN promtool check config /etc/tiered/monitoring/compose/prometheus.yml \
    && promtool check config /etc/tiered/monitoring/swarm/prometheus.yml \
    && amtool check-config /etc/tiered/monitoring/alertmanager.yml

# The TSDB and the silences live in volumes mounted on these folders (owned by `tiered`: an
# empty volume takes the folder's owner on first use); the targets folder is mounted read-only.
RUN useradd --system --create-home --uid 10001 tiered \
    && mkdir -p /var/lib/tiered/prometheus /var/lib/tiered/alertmanager /var/lib/tiered/targets \
    && chown -R tiered /var/lib/tiered
USER tiered
WORKDIR /home/tiered

EXPOSE 9090 9093
CMD ["prometheus", "--config.file=/etc/tiered/monitoring/compose/prometheus.yml", \
     "--storage.tsdb.path=/var/lib/tiered/prometheus", "--storage.tsdb.retention.time=30d", \
     "--web.listen-address=0.0.0.0:9090"]

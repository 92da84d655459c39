# The center tier: the full-precision TorchScript model on an NVIDIA GPU (CPU when none).
#
#   docker compose build center         (or: docker build -f docker/center.Dockerfile -t tiered/center .)
#
# Base image: python:3.11-slim, not nvidia/cuda. The PyPI torch wheel for Linux x86_64 is the
# CUDA build and carries its own CUDA runtime, cuBLAS and cuDNN as nvidia-*-cu12 wheels, so an
# nvidia/cuda base would only add a second copy of those libraries (several GB) and a Python
# that is not 3.11 (Ubuntu 22.04 ships 3.10). What the container needs from the host is the
# NVIDIA driver (libcuda), which the NVIDIA Container Toolkit mounts in when the container asks
# for a GPU (`deploy.resources.reservations.devices` in docker-compose.yml, or `--gpus all`).
# Host requirements: an NVIDIA driver recent enough for torch's CUDA 12 build, and the toolkit.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility

# torch alone first (the multi-GB layer), so changes to the project do not download it again.
# Fail the build if pip resolved a CPU-only build.
RUN pip install torch==2.13.0 \
    && python -c "import torch; assert torch.version.cuda, f'torch {torch.__version__} has no CUDA'"

# The project with all its dependencies (torch is already satisfied).
COPY . /src
RUN pip install /src && rm -rf /src \
    && python -c "import center.cli" && center --help >/dev/null

RUN useradd --system --create-home --uid 10001 tiered \
    && mkdir -p /var/lib/tiered/center && chown -R tiered /var/lib/tiered
USER tiered
WORKDIR /home/tiered

ENV CENTER_HOST=0.0.0.0 CENTER_PORT=8100 CENTER_STORE=/var/lib/tiered/center \
    CENTER_DEVICE=auto
EXPOSE 8100 8101
CMD ["center"]

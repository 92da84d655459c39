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
#
# CPU build (no GPU on the host; docker-compose.cpu.yml passes these):
#   --build-arg CENTER_TORCH=cpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
FROM python:3.11-slim-bookworm

# cuda: PyPI's torch (the CUDA build), and the build fails if it has no CUDA; cpu: a CPU wheel.
ARG CENTER_TORCH=cuda
# A page or folder of wheels pip may also take torch from (a local mirror, a CPU wheel at hand):
# a local 2.13.0+cpu wins over the index's 2.13.0. Empty: the index alone.
ARG TORCH_FIND_LINKS=
ARG TORCH_INDEX_URL=https://pypi.org/simple

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility

# torch alone first (the multi-GB layer), so changes to the project do not download it again.
# Fail the build if pip resolved a CPU-only torch where CUDA was asked for, or the reverse.
RUN pip install --index-url "$TORCH_INDEX_URL" ${TORCH_FIND_LINKS:+--find-links "$TORCH_FIND_LINKS"} \
    torch==2.13.0 \
    && python -c "import sys, torch; assert bool(torch.version.cuda) == (sys.argv[1] == 'cuda'), \
                  f'CENTER_TORCH={sys.argv[1]} but torch {torch.__version__} was installed'" \
                 "$CENTER_TORCH"

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

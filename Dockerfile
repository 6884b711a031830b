# The SpecPilot operator image and the emulator image (two targets of one build):
#   docker build --target operator -t ghcr.io/specpilot/specpilot:0.1.0 .
#   docker build --target emulator -t ghcr.io/specpilot/specpilot-emulator:0.1.0 .
# Only the operator's dependencies (pyproject's [project] dependencies, pinned by
# image/constraints.txt): no torch (the `probe` extra), no engine. The engines run in their
# own official images, pinned in one place: DEFAULT_IMAGES in operator/api/models.py.
# Runs as 65532 with a read-only root filesystem: nothing is written outside /tmp (the chart
# mounts an emptyDir there).
# The base: any Debian bookworm with CPython 3.11 and its venv module. By default Python's
# official slim image; `make image` builds it from Debian's packages instead (debootstrap),
# since no container registry is reachable from the machines the tests run on (image/README.md).
# Both name the interpreter python3.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# A build machine behind a TLS-inspecting proxy passes its CA bundle's path (mounted for the
# build only); unset, pip trusts its own bundle. Only the build stage sees it.
ARG PIP_CERT
WORKDIR /src
COPY image/constraints.txt image/constraints.txt
COPY pyproject.toml README.md ./
COPY operator operator
COPY runtime runtime
COPY tuner tuner
RUN python3 -m venv /opt/specpilot \
 && /opt/specpilot/bin/pip install --no-cache-dir --no-compile -c image/constraints.txt . \
 && /opt/specpilot/bin/python -m compileall -q /opt/specpilot

FROM ${PYTHON_IMAGE} AS operator
COPY --from=build /opt/specpilot /opt/specpilot
ENV PATH=/opt/specpilot/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
USER 65532:65532
ENTRYPOINT ["specpilot"]
CMD ["operator"]

# A GPU-less engine for test clusters: a SpecDeployment runs it with spec.image set to this
# image and spec.command [specpilot, emulate, --engine, vllm].
FROM operator AS emulator
EXPOSE 8000
CMD ["emulate", "--engine", "vllm"]

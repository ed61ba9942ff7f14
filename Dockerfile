# One image, four entrypoints: `partkeeper run watcher|allocator|reclaimer|gc` (make image).
# The services need only the project's runtime dependencies; EXTRAS=sim adds the simulator, the
# partkeeper-sim distribution in ./sim (`partkeeper up`, `partkeeper sim`, PK_DRIVER=sim), as
# compose/ builds it.
# NVML is not in the image: the NVIDIA container toolkit (or the driver-root component) provides
# libnvidia-ml from the node's driver (docs/operations.md).
FROM python:3.11-slim AS build
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY partkeeper ./partkeeper
COPY schemas ./schemas
COPY services ./services
COPY sim ./sim
RUN pip install --no-cache-dir --prefix=/install . ${EXTRAS:+"./$EXTRAS"}

FROM python:3.11-slim
ARG VERSION=dev
LABEL org.opencontainers.image.title="partkeeper" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /install /usr/local
# The default user and group, those the manifests run the watcher and provisioning as (UID and
# GID 10001); the DaemonSet sets each container's own (deploy/base/daemonset.yaml).
RUN groupadd --system --gid 10001 partkeeper \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin partkeeper
USER 10001:10001
ENTRYPOINT ["partkeeper"]
CMD ["--help"]

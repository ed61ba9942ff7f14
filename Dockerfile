# One image, four entrypoints: `partkeeper run watcher|allocator|reclaimer|gc`.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY partkeeper ./partkeeper
COPY schemas ./schemas
COPY services ./services
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
RUN useradd --system --uid 10001 partkeeper
USER 10001
ENTRYPOINT ["partkeeper"]
CMD ["run", "watcher"]

# One image for every gangshare component; the command picks the role:
#   gangshare operator | gangshare extender | gangshare agent
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# The kubelet API stubs are build output of `make protos` (scripts/gen-kubelet-api.sh).
RUN test -f src/gangshare/agent/kubeletapi/deviceplugin_pb2.py \
    || { echo "run 'make protos' before building the image" >&2; exit 1; }
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 65532 --create-home gangshare
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 65532
ENTRYPOINT ["gangshare"]
CMD ["--help"]

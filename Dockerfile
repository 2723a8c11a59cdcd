# One image for every gangshare component; the command picks the role:
#   gangshare operator | gangshare extender | gangshare agent
# `make image` builds the same image where no base image can be pulled
# (src/gangshare/dev/release_image.py); tests/e2e/test_image.py holds the two to one contract:
# Python 3.11 under /usr/local, the wheel of this checkout with its dependencies, entrypoint
# `gangshare`, user and group 65532.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# The kubelet API stubs are build output of `make protos` (scripts/gen-kubelet-api.sh).
RUN test -f src/gangshare/agent/kubeletapi/deviceplugin_pb2.py \
    || { echo "run 'make protos' before building the image" >&2; exit 1; }
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN groupadd --gid 65532 gangshare \
    && useradd --uid 65532 --gid 65532 --create-home --shell /usr/sbin/nologin gangshare
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 65532:65532
ENTRYPOINT ["gangshare"]
CMD ["--help"]

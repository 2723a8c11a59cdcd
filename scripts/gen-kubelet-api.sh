#!/usr/bin/env bash
# Generate the Python gRPC stubs of the kubelet's device-plugin (v1beta1) and PodResources (v1)
# APIs from their api.proto in the Go module k8s.io/kubelet, at the version matching the
# Kubernetes the project builds (scripts/build-k8s.sh). The stubs are build output: they go to
# src/gangshare/agent/kubeletapi/ (git-ignored) and are regenerated when the version changes.
#
# Usage: scripts/gen-kubelet-api.sh [python]   (python: the interpreter with grpcio-tools)
set -euo pipefail
cd "$(dirname "$0")/.."

KUBELET_API_VERSION="v0.35.4" # k8s.io/kubelet for Kubernetes v1.35.4
PYTHON="${1:-.venv/bin/python}"
PACKAGE="gangshare/agent/kubeletapi"
OUT="src/${PACKAGE}"
STAMP="${OUT}/.generated"

if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "k8s.io/kubelet@${KUBELET_API_VERSION}" ]]; then
    exit 0
fi
command -v go >/dev/null || { echo "gen-kubelet-api: go not found on PATH" >&2; exit 1; }

export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod
json="$(cd "${TMPDIR:-/tmp}" && go mod download -json "k8s.io/kubelet@${KUBELET_API_VERSION}")"
module_dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"${json}" | head -n 1)"
[[ -d "${module_dir}" ]] || { echo "gen-kubelet-api: go mod download gave no Dir: ${json}" >&2; exit 1; }

# The proto's path under -I becomes the Python import path of the generated modules, so stage
# each api.proto under the package path and a distinct name.
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
mkdir -p "${work}/${PACKAGE}"
cp "${module_dir}/pkg/apis/deviceplugin/v1beta1/api.proto" "${work}/${PACKAGE}/deviceplugin.proto"
cp "${module_dir}/pkg/apis/podresources/v1/api.proto" "${work}/${PACKAGE}/podresources.proto"
"${PYTHON}" -m grpc_tools.protoc -I "${work}" --python_out=src --pyi_out=src \
    --grpc_python_out=src "${work}/${PACKAGE}/deviceplugin.proto" "${work}/${PACKAGE}/podresources.proto"
echo "k8s.io/kubelet@${KUBELET_API_VERSION}" >"${STAMP}"
echo "gen-kubelet-api: stubs for k8s.io/kubelet@${KUBELET_API_VERSION} in ${OUT}" >&2

#!/usr/bin/env bash
# Build the real Kubernetes components (control plane, kubectl, kubelet; plus etcd, kwok,
# helm, Prometheus, promtool) from Go modules, into a per-version cache OUTSIDE the repository.
#
# Why this exists: gangshare's integration tests need a real kube-apiserver /
# scheduler / controller-manager, but this project must never commit binaries,
# module caches or copied upstream code, and the build machines can reach only
# the Go module proxy (no GitHub, no dl.k8s.io, no Docker).  So everything is
# compiled from the exact upstream module versions pinned below.
#
# Usage:
#   scripts/build-k8s.sh                 build whatever is missing (warm run: seconds)
#   scripts/build-k8s.sh --print-bin-dir print the bin folder and exit (no build)
#   scripts/build-k8s.sh --check         exit 0 if every binary is present, 1 otherwise
#   scripts/build-k8s.sh --latest        show the newest versions the proxy offers
#                                        (to help bump the pins; builds nothing)
#
# Environment:
#   GANGSHARE_CACHE   cache root (default: $HOME/.cache/gangshare)
#   GOMODCACHE/GOCACHE are honoured; the Go defaults (outside the repo) are shared
#   across versions so a bump only recompiles what changed.
set -euo pipefail

# ---------------------------------------------------------------------------
# Pinned versions.  The Kubernetes version is the cache key; the others are
# recorded per binary (see STAMP_DIR) so bumping one of them rebuilds only it.
#
# K8S_VERSION: newest 1.35.x the module proxy serves.  Its go.mod says
#   `go 1.25.0`, which the local Go 1.26 toolchain accepts (1.36.x would work
#   too, but the project targets 1.35).
# ETCD_VERSION: newest 3.6 patch; etcd 3.6 is the series Kubernetes 1.35
#   is validated against.  server/v3 pins api/v3, client/pkg/v3, ... at the
#   same version itself, so no extra replace lines are needed.
# KWOK_VERSION: newest kwok release; its go.mod (`go 1.26.0`) is accepted by
#   Go 1.26.x and it has no replace directives.
# HELM_VERSION: newest v3 (v4 has a different CLI / module path).
# PROMETHEUS_VERSION: newest the proxy serves.  Prometheus publishes its Go
#   module as v0.3MM.P for release 3.MM.P (v0.316.0 is Prometheus 3.16.0; the
#   module has no v3 path).  Its go.mod says `go 1.26.7` (accepted by Go 1.26.8)
#   and has no replace directives.  Only tests/e2e/test_prometheus.py runs it,
#   with static scrape targets, so it is built with `remove_all_sd` (no
#   service discoveries, hence none of their cloud SDKs) and without
#   `builtinassets` (the web UI's compiled assets are not in the module zip and
#   need npm; only the HTTP API is used).  promtool comes from the same module
#   version with the same tags and version stamping: tests/e2e/test_sim_replay.py
#   backfills the simulator's OpenMetrics output into blocks with
#   `promtool tsdb create-blocks-from openmetrics`.
# ---------------------------------------------------------------------------
# JOBSET_VERSION: newest JobSet release whose go.mod requires k8s.io/api v0.35 (the
#   Kubernetes minor above) and `go 1.25.0`; the proxy serves exact versions but no list, so
#   it is named exactly. Its controller (main package at the module root) runs in the local
#   control plane for the JobSet tests; its CRD is copied from the module into the cache
#   (manifests/), never into the repository.
# TRAINER_VERSION: Kubeflow Trainer v2.0.0, the only release of github.com/kubeflow/trainer/v2 the
#   proxy serves (first v2: TrainJob, TrainingRuntime, ClusterTrainingRuntime v1alpha1).
#   Its go.mod says `go 1.24.0` with no replace directives, and requires k8s.io/* v0.32 and
#   sigs.k8s.io/jobset v0.8.2, whose JobSet v1alpha2 API the JobSet controller above still
#   serves. Its controller (cmd/trainer-controller-manager) creates a JobSet per TrainJob;
#   its three CRDs (manifests/base/crds) go to the cache like JobSet's.
# TRAINING_OPERATOR_VERSION: Kubeflow training-operator v1.8.1, the newest v1 the proxy serves
#   (PyTorchJob kubeflow.org/v1; v1 is the line Trainer v2 replaces). go.mod `go 1.22`,
#   k8s.io/* v0.29, no replace directives. Main package cmd/training-operator.v1; the CRDs
#   of manifests/base/crds (PyTorchJob and the other v1 kinds) go to the cache.
K8S_VERSION="v1.35.4"
ETCD_VERSION="v3.6.16"
KWOK_VERSION="v0.8.0"
HELM_VERSION="v3.22.0"
PROMETHEUS_VERSION="v0.316.0"
JOBSET_VERSION="v0.11.0"
TRAINER_VERSION="v2.0.0"
TRAINING_OPERATOR_VERSION="v1.8.1"

# Bump when the build recipe (ldflags, wrapper layout, ...) changes without a
# version change: it is part of every stamp, so cached binaries get rebuilt.
RECIPE_REVISION="1"

K8S_MODULE="k8s.io/kubernetes"
ETCD_MODULE="go.etcd.io/etcd/server/v3"
KWOK_MODULE="sigs.k8s.io/kwok"
HELM_MODULE="helm.sh/helm/v3"
PROMETHEUS_MODULE="github.com/prometheus/prometheus"
JOBSET_MODULE="sigs.k8s.io/jobset"
TRAINER_MODULE="github.com/kubeflow/trainer/v2"
TRAINING_OPERATOR_MODULE="github.com/kubeflow/training-operator"

K8S_BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet)
PROMETHEUS_BINARIES=(prometheus promtool)
ALL_BINARIES=("${K8S_BINARIES[@]}" etcd kwok helm "${PROMETHEUS_BINARIES[@]}" jobset-controller
    trainer-controller-manager training-operator)

CACHE_ROOT="${GANGSHARE_CACHE:-$HOME/.cache/gangshare}"
KEY_DIR="${CACHE_ROOT}/k8s/${K8S_VERSION}"
BIN_DIR="${KEY_DIR}/bin"
# Stamps live next to (not inside) bin/ so bin/ holds nothing but executables
# and can be put straight on PATH.
STAMP_DIR="${KEY_DIR}/stamps"
# Upstream manifests a binary needs at run time (the CRDs of JobSet, Trainer and the training
# operator), taken from its module.
MANIFEST_DIR="${KEY_DIR}/manifests"

# Never let Go fetch a different toolchain (the proxy may not serve one, and
# we want reproducible "built with the local Go" results); a module whose
# `go` line is newer than the local Go then fails loudly instead.
export GOTOOLCHAIN=local
# The wrapper modules below are generated without a go.sum and with only the
# top-level require; -mod=mod lets `go build` resolve and record the rest.
# -buildvcs=false because the wrapper dir is not a VCS checkout anyway.
export GOFLAGS="-mod=mod -buildvcs=false"
# A go.work in a parent dir (or GOWORK in the env) must not hijack the wrappers.
export GOWORK=off
# Static, libc-independent binaries: they run anywhere on this arch and the
# build needs no C toolchain.
export CGO_ENABLED=0

log() { printf '[build-k8s] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# stamp_value <binary>: the component version (and recipe revision) a binary
# must have been built from for the cached copy to count as current.  The key
# folder only encodes the Kubernetes version, so without this a bumped
# etcd/kwok/helm pin would silently keep the old binary.
stamp_value() {
    local mv
    case "$1" in
        kube-*|kubectl|kubelet) mv="${K8S_MODULE}@${K8S_VERSION}" ;;
        etcd) mv="${ETCD_MODULE}@${ETCD_VERSION}" ;;
        kwok) mv="${KWOK_MODULE}@${KWOK_VERSION}" ;;
        helm) mv="${HELM_MODULE}@${HELM_VERSION}" ;;
        prometheus|promtool) mv="${PROMETHEUS_MODULE}@${PROMETHEUS_VERSION}" ;;
        jobset-controller) mv="${JOBSET_MODULE}@${JOBSET_VERSION}" ;;
        trainer-controller-manager) mv="${TRAINER_MODULE}@${TRAINER_VERSION}" ;;
        training-operator) mv="${TRAINING_OPERATOR_MODULE}@${TRAINING_OPERATOR_VERSION}" ;;
        *) die "unknown binary $1" ;;
    esac
    echo "${mv} recipe=${RECIPE_REVISION}"
}

is_current() {
    local name="$1"
    [[ -x "${BIN_DIR}/${name}" && -f "${STAMP_DIR}/${name}" ]] &&
        [[ "$(cat "${STAMP_DIR}/${name}")" == "$(stamp_value "${name}")" ]]
}

all_current() {
    local b
    for b in "${ALL_BINARIES[@]}"; do
        is_current "$b" || return 1
    done
}

case "${1:-}" in
    --print-bin-dir)
        echo "${BIN_DIR}"
        exit 0
        ;;
    --check)
        if all_current; then exit 0; fi
        for b in "${ALL_BINARIES[@]}"; do
            is_current "$b" || log "missing or stale: ${BIN_DIR}/${b}"
        done
        exit 1
        ;;
    --latest)
        for m in "${K8S_MODULE}" "${ETCD_MODULE}" "${KWOK_MODULE}" "${HELM_MODULE}" \
            "${PROMETHEUS_MODULE}" "${JOBSET_MODULE}" "${TRAINER_MODULE}" "${TRAINING_OPERATOR_MODULE}"; do
            printf '%s: %s\n' "$m" "$(go list -m -versions -f '{{range .Versions}}{{.}} {{end}}' "$m" | tr ' ' '\n' | grep . | tail -n 8 | tr '\n' ' ')"
        done
        exit 0
        ;;
    -h|--help)
        sed -n '2,21p' "$0"
        exit 0
        ;;
    "") ;;
    *) die "unknown argument: $1 (see --help)" ;;
esac

command -v go >/dev/null || die "go not found on PATH"

TOTAL_START=$(date +%s)

# Fast path: a warm run must not touch the network or even start `go`.
if all_current; then
    log "all binaries cached in ${BIN_DIR} (0s)"
    exit 0
fi

mkdir -p "${BIN_DIR}" "${STAMP_DIR}"

# Two concurrent runs (e.g. parallel CI jobs) would otherwise race on the
# same output files; the second simply waits and then finds everything built.
exec 9>"${KEY_DIR}/.lock"
if command -v flock >/dev/null; then
    flock 9
fi

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/gangshare-build-k8s.XXXXXX")"
cleanup() { rm -rf "${WORK_DIR}"; }
trap cleanup EXIT

GO_VERSION="$(go env GOVERSION)"
log "go ${GO_VERSION}, GOMODCACHE=$(go env GOMODCACHE), GOCACHE=$(go env GOCACHE)"
log "work dir ${WORK_DIR}, output ${BIN_DIR}"

# mod_field <module@version> <Field>: a field of `go mod download -json`
# (GoMod = path of the upstream go.mod, Info = path of the .info JSON that
# holds the release timestamp).
mod_field() {
    local json
    json="$(go mod download -json "$1")" || die "go mod download $1 failed"
    if grep -q '"Error"' <<<"${json}"; then
        die "go mod download $1: $(sed -n 's/.*"Error": "\(.*\)".*/\1/p' <<<"${json}")"
    fi
    sed -n "s/^[[:space:]]*\"$2\": \"\(.*\)\",\{0,1\}\$/\1/p" <<<"${json}" | head -n 1
}

# write_wrapper <dir> <module> <version> [extra go.mod lines...]
# Creates a throwaway main module that requires the upstream module.  This is
# needed because `go install mod/cmd/x@v` refuses modules whose go.mod has
# replace directives (kubernetes, etcd), and using one mechanism for all
# components keeps things uniform.  The upstream `go` and `godebug` lines are
# copied so the binaries get the same GODEBUG defaults as official builds
# (those are decided by the *main* module's go.mod, i.e. ours).
write_wrapper() {
    local dir="$1" module="$2" version="$3"
    shift 3
    local upstream_mod go_line
    upstream_mod="$(mod_field "${module}@${version}" GoMod)"
    [[ -f "${upstream_mod}" ]] || die "no go.mod for ${module}@${version}"
    go_line="$(awk '$1 == "go" { print $2; exit }' "${upstream_mod}")"
    mkdir -p "${dir}"
    {
        echo "module gangshare.local/build/$(basename "${dir}")"
        echo
        echo "go ${go_line}"
        echo
        grep -E '^godebug([[:space:]]|\()' "${upstream_mod}" || true
        echo
        echo "require ${module} ${version}"
        local line
        for line in "$@"; do
            echo "${line}"
        done
    } >"${dir}/go.mod"
}

# k8s_replace_lines <kubernetes go.mod>: k8s.io/kubernetes points its staging
# modules (k8s.io/api, k8s.io/client-go, ...) at ./staging/src/... and
# requires them at v0.0.0.  Those local paths do not exist for a consumer, so
# redirect each one to the published staging module of the matching version
# (v1.X.Y -> v0.X.Y).  The list is read from the upstream go.mod so it stays
# right when K8S_VERSION changes (staging modules come and go between releases).
k8s_replace_lines() {
    local gomod="$1" staging_version="v0.${K8S_VERSION#v1.}"
    awk '
        /^replace[[:space:]]*\(/ { blk = 1; next }
        blk && /^\)/             { blk = 0; next }
        blk                      { print; next }
        /^replace[[:space:]]/    { sub(/^replace[[:space:]]+/, ""); print }
    ' "${gomod}" | sed 's://.*$::' | while read -r old a b c d; do
        [[ -n "${old}" ]] || continue
        # Forms: "old => new [ver]" or "old oldver => new [ver]".
        local new newver
        if [[ "${a}" == "=>" ]]; then new="${b}"; newver="${c}"; else new="${c}"; newver="${d}"; fi
        case "${new}" in
            ./staging/src/*) echo "replace ${old} => ${old} ${staging_version}" ;;
            # die would only exit this pipeline's subshell; let the caller fail.
            ./* | ../* | /*) echo "!unexpected local replace: ${old} => ${new}" ;;
            # A pin to another module version: keep it, upstream relies on it.
            *) echo "replace ${old} => ${new} ${newver}" ;;
        esac
    done
}

# go_build <wrapper dir> <output name> <package> <ldflags> [build tags]
# Builds into a temp name and renames, so an interrupted build never leaves a
# half-written file that a later run would mistake for a cached binary.
go_build() {
    local dir="$1" name="$2" pkg="$3" ldflags="$4" tags="${5:-}"
    local start tmp_out
    start=$(date +%s)
    tmp_out="${BIN_DIR}/.${name}.partial.$$"
    (cd "${dir}" && go build -trimpath -tags "${tags}" -ldflags "-s -w ${ldflags}" -o "${tmp_out}" "${pkg}") ||
        { rm -f "${tmp_out}"; die "building ${name} (${pkg}) failed"; }
    mv -f "${tmp_out}" "${BIN_DIR}/${name}"
    stamp_value "${name}" >"${STAMP_DIR}/${name}"
    log "$(printf '%-24s built in %5ss' "${name}" "$(( $(date +%s) - start ))")"
}

# --- Kubernetes: kube-apiserver, kube-scheduler, kube-controller-manager, kubectl,
# kubelet (only src/gangshare/dev/realnode.py runs it; static like the rest)
build_k8s() {
    local need=() b
    for b in "${K8S_BINARIES[@]}"; do
        if is_current "$b"; then log "$(printf '%-24s cached' "$b")"; else need+=("$b"); fi
    done
    [[ ${#need[@]} -gt 0 ]] || return 0

    local dir="${WORK_DIR}/kubernetes" gomod build_date minor
    gomod="$(mod_field "${K8S_MODULE}@${K8S_VERSION}" GoMod)"
    mapfile -t replaces < <(k8s_replace_lines "${gomod}")
    [[ ${#replaces[@]} -gt 0 ]] || die "found no staging replaces in ${gomod}"
    if printf '%s\n' "${replaces[@]}" | grep -q '^!'; then
        die "$(printf '%s\n' "${replaces[@]}" | grep '^!') in ${gomod}"
    fi
    write_wrapper "${dir}" "${K8S_MODULE}" "${K8S_VERSION}" "${replaces[@]}"
    log "kubernetes wrapper: ${#replaces[@]} staging replace lines"

    # Official builds stamp the version via hack/lib/version.sh; without this
    # kubectl/apiserver report v0.0.0-master and clients (helm, kwok, version
    # skew checks) misbehave.  Both component-base (servers, kubectl) and
    # client-go (user agent, discovery) carry a copy of these variables.
    # gitCommit is unknowable from the module proxy, hence a fixed placeholder.
    # buildDate is the module's release time so rebuilds are reproducible.
    local info
    info="$(mod_field "${K8S_MODULE}@${K8S_VERSION}" Info)"
    build_date="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "${info}")"
    [[ -n "${build_date}" ]] || build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    minor="${K8S_VERSION#v1.}"
    minor="${minor%%.*}"
    local ldflags="" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
        ldflags+=" -X ${pkg}.gitMajor=1"
        ldflags+=" -X ${pkg}.gitMinor=${minor}"
        ldflags+=" -X ${pkg}.gitTreeState=clean"
        ldflags+=" -X ${pkg}.gitCommit=0000000000000000000000000000000000000000"
        ldflags+=" -X ${pkg}.buildDate=${build_date}"
    done

    # One binary at a time: the shared GOCACHE makes the 2nd..4th builds reuse
    # almost everything, and linking several huge binaries at once can exhaust
    # memory on small machines.
    for b in "${need[@]}"; do
        go_build "${dir}" "$b" "${K8S_MODULE}/cmd/$b" "${ldflags}"
    done
}

# --- etcd: upstream's main package lives in the root module go.etcd.io/etcd/v3,
# which has local replaces (and is not always on the proxy), so we compile our
# own two-line main around the same entry point upstream's main.go calls.
build_etcd() {
    if is_current etcd; then log "$(printf '%-24s cached' etcd)"; return 0; fi
    local dir="${WORK_DIR}/etcd"
    write_wrapper "${dir}" "${ETCD_MODULE}" "${ETCD_VERSION}"
    cat >"${dir}/main.go" <<'EOF'
// Generated by gangshare scripts/build-k8s.sh; mirrors etcd's own main.go.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    # api/v3/version.Version is already the release number in source; only
    # the git SHA is left to the build; it is unknowable from the proxy, so
    # record where the build came from instead of upstream's "Not provided".
    go_build "${dir}" etcd . "-X go.etcd.io/etcd/api/v3/version.GitSHA=module-${ETCD_VERSION}"
}

# --- kwok: only the `kwok` controller, not kwokctl.
build_kwok() {
    if is_current kwok; then log "$(printf '%-24s cached' kwok)"; return 0; fi
    local dir="${WORK_DIR}/kwok"
    write_wrapper "${dir}" "${KWOK_MODULE}" "${KWOK_VERSION}"
    # consts.Version already equals the release in source; setting it anyway
    # (as upstream's hack/releases.sh does) keeps `kwok --version` right if
    # upstream ever forgets to bump it.  It is also what fake nodes report as
    # kubeletVersion ("kwok-0.8.0").  consts.KubeVersion only matters to
    # kwokctl, which we do not build.
    go_build "${dir}" kwok "${KWOK_MODULE}/cmd/kwok" \
        "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
}

# --- helm v3
build_helm() {
    if is_current helm; then log "$(printf '%-24s cached' helm)"; return 0; fi
    local dir="${WORK_DIR}/helm" gomod cg major minor
    write_wrapper "${dir}" "${HELM_MODULE}" "${HELM_VERSION}"
    # Same stamping as helm's Makefile: without `version` it reports "v3.22"
    # (no patch); k8sVersionMajor/Minor (default 1.20!) feed .Capabilities
    # .KubeVersion for `helm template`, derived from helm's client-go.
    gomod="$(mod_field "${HELM_MODULE}@${HELM_VERSION}" GoMod)"
    cg="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "${gomod}")"
    cg="${cg#v}"
    major=$(( ${cg%%.*} + 1 ))
    minor="${cg#*.}"
    minor="${minor%%.*}"
    local p="helm.sh/helm/v3"
    go_build "${dir}" helm "${p}/cmd/helm" \
        "-X ${p}/internal/version.version=${HELM_VERSION} -X ${p}/internal/version.gitTreeState=clean \
 -X ${p}/pkg/lint/rules.k8sVersionMajor=${major} -X ${p}/pkg/lint/rules.k8sVersionMinor=${minor} \
 -X ${p}/pkg/chartutil.k8sVersionMajor=${major} -X ${p}/pkg/chartutil.k8sVersionMinor=${minor}"
}

# --- Prometheus and promtool, from one module version with one set of tags and stamps:
# prometheus for tests/e2e/test_prometheus.py (against the dashboards), promtool to backfill
# the simulator's OpenMetrics into TSDB blocks (tests/e2e/test_sim_replay.py, docs/simulator.md).
build_prometheus() {
    local need=() b
    for b in "${PROMETHEUS_BINARIES[@]}"; do
        if is_current "$b"; then log "$(printf '%-24s cached' "$b")"; else need+=("$b"); fi
    done
    [[ ${#need[@]} -gt 0 ]] || return 0
    local dir="${WORK_DIR}/prometheus" info build_date
    write_wrapper "${dir}" "${PROMETHEUS_MODULE}" "${PROMETHEUS_VERSION}"
    # Same variables as upstream's .promu.yml; without them `prometheus --version`
    # and prometheus_build_info report nothing.  v0.3MM.P -> 3.MM.P.
    info="$(mod_field "${PROMETHEUS_MODULE}@${PROMETHEUS_VERSION}" Info)"
    build_date="$(sed -n 's/.*"Time": *"\([0-9]*\)-\([0-9]*\)-\([0-9]*\)T\([0-9:]*\).*/\1\2\3-\4/p' "${info}")"
    local release="${PROMETHEUS_VERSION#v0.}" p="github.com/prometheus/common/version"
    release="3.$(( 10#${release:1:2} )).${release#*.}"
    for b in "${need[@]}"; do
        go_build "${dir}" "$b" "${PROMETHEUS_MODULE}/cmd/$b" \
            "-X ${p}.Version=${release} -X ${p}.Revision=module-${PROMETHEUS_VERSION} \
 -X ${p}.Branch=HEAD -X ${p}.BuildUser=gangshare -X ${p}.BuildDate=${build_date}" \
            "netgo remove_all_sd"
    done
}

# --- the JobSet controller (sigs.k8s.io/jobset's main package) and its CRD
build_jobset() {
    if is_current jobset-controller && [[ -f "${MANIFEST_DIR}/jobset.x-k8s.io_jobsets.yaml" ]]; then
        log "$(printf '%-24s cached' jobset-controller)"
        return 0
    fi
    local dir="${WORK_DIR}/jobset" module_dir
    write_wrapper "${dir}" "${JOBSET_MODULE}" "${JOBSET_VERSION}"
    module_dir="$(mod_field "${JOBSET_MODULE}@${JOBSET_VERSION}" Dir)"
    mkdir -p "${MANIFEST_DIR}"
    cp "${module_dir}/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "${MANIFEST_DIR}/"
    chmod u+w "${MANIFEST_DIR}/jobset.x-k8s.io_jobsets.yaml"
    go_build "${dir}" jobset-controller "${JOBSET_MODULE}" \
        "-X ${JOBSET_MODULE}/pkg/version.GitVersion=${JOBSET_VERSION} -X ${JOBSET_MODULE}/pkg/version.GitCommit=module-${JOBSET_VERSION}"
}

# copy_crds <module dir> <folder in the module> <file>...: upstream CRDs into the cache.
copy_crds() {
    local from="$1/$2" f
    shift 2
    mkdir -p "${MANIFEST_DIR}"
    for f in "$@"; do
        [[ -f "${from}/${f}" ]] || die "no ${f} in ${from}"
        cp "${from}/${f}" "${MANIFEST_DIR}/"
        chmod u+w "${MANIFEST_DIR}/${f}"
    done
}

# --- Kubeflow Trainer v2's controller manager and its CRDs (src/gangshare/dev/trainer.py)
TRAINER_CRDS=(trainer.kubeflow.org_trainjobs.yaml trainer.kubeflow.org_trainingruntimes.yaml
    trainer.kubeflow.org_clustertrainingruntimes.yaml)
build_trainer() {
    local f cached=1
    for f in "${TRAINER_CRDS[@]}"; do [[ -f "${MANIFEST_DIR}/${f}" ]] || cached=0; done
    if is_current trainer-controller-manager && ((cached)); then
        log "$(printf '%-24s cached' trainer-controller-manager)"
        return 0
    fi
    local dir="${WORK_DIR}/trainer"
    write_wrapper "${dir}" "${TRAINER_MODULE}" "${TRAINER_VERSION}"
    copy_crds "$(mod_field "${TRAINER_MODULE}@${TRAINER_VERSION}" Dir)" manifests/base/crds \
        "${TRAINER_CRDS[@]}"
    # No version variables to stamp: upstream's image build sets none either.
    go_build "${dir}" trainer-controller-manager \
        "${TRAINER_MODULE}/cmd/trainer-controller-manager" ""
}

# --- Kubeflow training-operator v1 and its CRDs (src/gangshare/dev/training_operator.py)
TRAINING_OPERATOR_CRDS=(kubeflow.org_pytorchjobs.yaml kubeflow.org_tfjobs.yaml
    kubeflow.org_mpijobs.yaml kubeflow.org_xgboostjobs.yaml kubeflow.org_paddlejobs.yaml
    kubeflow.org_mxjobs.yaml)
build_training_operator() {
    local f cached=1
    for f in "${TRAINING_OPERATOR_CRDS[@]}"; do [[ -f "${MANIFEST_DIR}/${f}" ]] || cached=0; done
    if is_current training-operator && ((cached)); then
        log "$(printf '%-24s cached' training-operator)"
        return 0
    fi
    local dir="${WORK_DIR}/training-operator"
    write_wrapper "${dir}" "${TRAINING_OPERATOR_MODULE}" "${TRAINING_OPERATOR_VERSION}"
    copy_crds "$(mod_field "${TRAINING_OPERATOR_MODULE}@${TRAINING_OPERATOR_VERSION}" Dir)" \
        manifests/base/crds "${TRAINING_OPERATOR_CRDS[@]}"
    go_build "${dir}" training-operator "${TRAINING_OPERATOR_MODULE}/cmd/training-operator.v1" ""
}

build_k8s
build_etcd
build_kwok
build_helm
build_prometheus
build_jobset
build_trainer
build_training_operator

# Record what this bin folder holds, for humans and for tests that want to
# assert the versions they run against.
cat >"${KEY_DIR}/VERSIONS" <<EOF
kubernetes ${K8S_VERSION}
etcd ${ETCD_VERSION}
kwok ${KWOK_VERSION}
helm ${HELM_VERSION}
prometheus ${PROMETHEUS_VERSION}
promtool ${PROMETHEUS_VERSION}
jobset-controller ${JOBSET_VERSION}
trainer-controller-manager ${TRAINER_VERSION}
training-operator ${TRAINING_OPERATOR_VERSION}
go ${GO_VERSION}
EOF

all_current || die "some binaries are still missing after the build"
log "$(printf '%-24s %5ss' "total" "$(( $(date +%s) - TOTAL_START ))")"

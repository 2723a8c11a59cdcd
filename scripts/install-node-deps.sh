#!/usr/bin/env bash
# Install what the optional real kubelet node (src/gangshare/dev/realnode.py) needs
# on the host: a container runtime, CNI plugins, nftables (the pod network's one Service
# rule) and a static busybox for the test image.
#
# Idempotent: a second run with everything present does nothing (no apt-get update).
# Debian's containerd service must never run: realnode.py starts its own containerd
# with its own config, state and socket, and a second daemon would fight over
# /run/containerd and the k8s.io namespace.  So service starts are refused
# while the packages install (policy-rc.d), whatever the init system.
#
# Usage: scripts/install-node-deps.sh [--check]   (--check: exit 1 if anything is missing)
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins busybox-static nftables)

log() { printf '[node-deps] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

missing=()
for pkg in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null || true)"
    [[ "${status}" == "install ok installed" ]] || missing+=("${pkg}")
done

if [[ ${#missing[@]} -eq 0 ]]; then
    log "all present: ${PACKAGES[*]}"
    exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
    log "missing: ${missing[*]}"
    exit 1
fi

[[ "$(id -u)" -eq 0 ]] || die "missing ${missing[*]}; installing them needs root (run: sudo $0)"
command -v apt-get >/dev/null || die "missing ${missing[*]}; apt-get is not available here"

export DEBIAN_FRONTEND=noninteractive
POLICY=/usr/sbin/policy-rc.d
own_policy=0
if [[ ! -e "${POLICY}" ]]; then
    printf '#!/bin/sh\n# gangshare install-node-deps.sh: no service starts during install\nexit 101\n' \
        >"${POLICY}"
    chmod 755 "${POLICY}"
    own_policy=1
fi
cleanup() { if [[ ${own_policy} -eq 1 ]]; then rm -f "${POLICY}"; fi; }
trap cleanup EXIT

# Only refresh the package lists when apt cannot find a candidate for something.
need_update=0
for pkg in "${missing[@]}"; do
    candidate="$(apt-cache policy "${pkg}" 2>/dev/null | awk '/Candidate:/ { print $2 }')"
    if [[ -z "${candidate}" || "${candidate}" == "(none)" ]]; then need_update=1; fi
done
if [[ ${need_update} -eq 1 ]]; then
    log "apt-get update"
    apt-get update -qq >/dev/null || die "apt-get update failed"
fi

log "installing ${missing[*]}"
install() { apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
# Package lists that name a candidate can still be stale (the file is gone from the mirror):
# refresh them once and try again before giving up.
if ! install; then
    log "apt-get install failed; apt-get update and one more try"
    apt-get update -qq >/dev/null || die "apt-get update failed"
    install || die "apt-get install ${missing[*]} failed"
fi

# Should a systemd ever be running here, keep Debian's unit from starting at boot
# or on the next upgrade; harmless (and skipped) without systemd.
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
    systemctl disable --now containerd.service >/dev/null 2>&1 || true
fi
log "installed ${missing[*]}"

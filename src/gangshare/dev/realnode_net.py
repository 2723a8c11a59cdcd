"""The real node's pod network: a bridge, host-local addresses, and the API server's Service.

Pods without `hostNetwork` get a veth on the bridge `BRIDGE` and an address in `POD_CIDR`
from Debian's CNI plugins (`bridge` + `host-local`, whose data stays under the node's root).
We create the bridge and give it the gateway address ourselves, before containerd starts,
and the CNI config says `isGateway: false`: with `true` the bridge plugin would switch on
`net.ipv4.ip_forward` for the whole machine. Forwarding is not needed: nothing here is
routed. Pod to pod is bridged, host to pod (the API server's pod proxy, the kubelet's
probes) leaves from the bridge's own address, and pod to API server is delivered locally.

Stands in for kube-proxy for the API server only, since the dev cluster has none: one
nftables table of ours (`inet gangshare_realnode`, so teardown deletes just that) DNATs
what comes in on the bridge for the `kubernetes` Service (the first address of
`SERVICE_CIDR`, port 443: what in-cluster clients read from KUBERNETES_SERVICE_HOST/PORT)
to the API server on 127.0.0.1:<its port>. The kernel accepts a loopback destination from a
non-loopback interface only with `route_localnet` on it, so that is set on the bridge. No
other ClusterIP answers from a pod, and no DNS.

The machine's traffic may only go to loopback or into network namespaces the tests made,
so the same table also keeps pods in: from the bridge the host accepts only that DNAT'ed
connection and replies to its own connections (which also closes the hole `route_localnet`
would open to every loopback listener), and nothing is forwarded off the bridge should
someone turn forwarding on. IPv6 is off on the bridge.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from gangshare.dev.components import SERVICE_CIDR

POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
# At most 15 characters (IFNAMSIZ).
BRIDGE = "gs-pods0"
NETWORK = "gangshare-pods"
NFT_FAMILY = "inet"
NFT_TABLE = "gangshare_realnode"
SERVICE_PORT = 443
# libcni (inside containerd) caches each attachment's result here, named
# `<network>-<sandbox id>-<interface>`, and containerd 1.6 cannot move it; containerd adds
# its own loopback network, `cni-loopback`, to every sandbox.
CNI_CACHE = Path("/var/lib/cni")
CACHED_NETWORKS = (NETWORK, "cni-loopback")
SYS_NET = Path("/proc/sys/net")


class NetError(RuntimeError):
    pass


def service_ip() -> str:
    """The `kubernetes` Service's ClusterIP: the first address of the service range."""
    return str(ipaddress.ip_network(SERVICE_CIDR)[1])


def apiserver_endpoint(kubeconfig: Path) -> tuple[str, int]:
    """(loopback address, port) of the API server in the kubeconfig's current context."""
    config = yaml.safe_load(kubeconfig.read_text()) or {}
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    context = contexts.get(config.get("current-context", ""), {})
    cluster = clusters.get(context.get("cluster", ""))
    if cluster is None and len(clusters) == 1:
        cluster = next(iter(clusters.values()))
    if cluster is None:
        raise NetError(f"{kubeconfig} names no cluster for its current context")
    url = urlsplit(cluster["server"])
    host = url.hostname or ""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host) in ipaddress.ip_network("127.0.0.0/8"):
            return host, url.port or 443
    raise NetError(f"the API server {cluster['server']} is not on IPv4 loopback: cannot DNAT")


def cni_conflist(ipam_dir: Path) -> str:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    # The bridge already has the gateway address (set_up): `true` would only
                    # add switching on ip_forward machine-wide.
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                        # Without a gateway from the bridge plugin the route comes from here.
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(ipam_dir),
                    },
                },
                {"type": "loopback"},
            ],
        },
        indent=2,
    )


def nft_ruleset(apiserver: tuple[str, int]) -> str:
    """Replaces our table in one transaction (the empty `table` makes `delete` safe)."""
    address, port = apiserver
    table = f"{NFT_FAMILY} {NFT_TABLE}"
    return f"""\
table {table} {{}}
delete table {table}
table {table} {{
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "{BRIDGE}" ip daddr {service_ip()} tcp dport {SERVICE_PORT} \
dnat ip to {address}:{port}
    }}
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "{BRIDGE}" ct state established,related accept
        iifname "{BRIDGE}" ct status dnat ip daddr {address} tcp dport {port} accept
        iifname "{BRIDGE}" drop
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{BRIDGE}" oifname != "{BRIDGE}" drop
        oifname "{BRIDGE}" iifname != "{BRIDGE}" drop
    }}
}}
"""


def set_up(kubeconfig: Path) -> None:
    """The bridge (with the gateway address and its sysctls) and our nftables table, afresh."""
    apiserver = apiserver_endpoint(kubeconfig)
    if bridge_exists():
        _run("ip", "link", "del", BRIDGE)
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _sysctl(f"ipv4/conf/{BRIDGE}/route_localnet", "1")
    if (SYS_NET / "ipv6" / "conf" / BRIDGE).is_dir():
        _sysctl(f"ipv6/conf/{BRIDGE}/disable_ipv6", "1")
    prefix = ipaddress.ip_network(POD_CIDR).prefixlen
    _run("ip", "addr", "add", f"{POD_GATEWAY}/{prefix}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    _run("nft", "-f", "-", stdin=nft_ruleset(apiserver))


def tear_down(timeout: float = 5.0) -> list[str]:
    """Delete our table and the bridge, and the CNI cache entries of our sandboxes (which
    were never deleted through CNI: their containerd is gone); returns what stayed."""
    left = []
    if table_exists():
        _run("nft", "delete", "table", NFT_FAMILY, NFT_TABLE, check=False)
        if table_exists():
            left.append(f"nft table {NFT_FAMILY} {NFT_TABLE}")
    # A pod's host-side veth goes with its network namespace (unmounted by then).
    ports = bridge_ports()
    if bridge_exists():
        _run("ip", "link", "del", BRIDGE, check=False)
        if bridge_exists():
            left.append(f"bridge {BRIDGE}")
    deadline = time.monotonic() + timeout
    while ports and time.monotonic() < deadline:
        ports = [p for p in ports if (Path("/sys/class/net") / p).exists()]
        if ports:
            time.sleep(0.1)
    left += [f"veth {p}" for p in ports]
    left += [str(p) for p in remove_cni_cache()]
    return left


def bridge_exists() -> bool:
    return (Path("/sys/class/net") / BRIDGE).exists()


def bridge_ports() -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(p.name for p in (Path("/sys/class/net") / BRIDGE / "brif").iterdir())
    return []


def table_exists() -> bool:
    if shutil.which("nft") is None:
        return False  # then nobody made it either
    done = subprocess.run(
        ["nft", "list", "table", NFT_FAMILY, NFT_TABLE],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0


def cni_cache_entries() -> list[Path]:
    """libcni's cached results of our networks (for teardown, and for tests to check)."""
    results = CNI_CACHE / "results"
    if not results.is_dir():
        return []
    return sorted(p for p in results.iterdir() if p.name.startswith(CACHED_NETWORKS))


def remove_cni_cache() -> list[Path]:
    """Our entries, then whichever of the cache's folders that leaves empty; what stayed."""
    for entry in cni_cache_entries():
        entry.unlink(missing_ok=True)
    for folder in (CNI_CACHE / "results", CNI_CACHE):
        with contextlib.suppress(OSError):  # not there, or someone else's entries in it
            folder.rmdir()
    return cni_cache_entries()


def _sysctl(name: str, value: str) -> None:
    (SYS_NET / name).write_text(value)


def _run(*argv: str, stdin: str | None = None, check: bool = True) -> str:
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise NetError(f"{' '.join(argv)}: {err}") from None
    if check and done.returncode != 0:
        raise NetError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout

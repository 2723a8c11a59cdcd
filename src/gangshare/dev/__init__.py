"""Developer tooling: the local control plane (etcd, kube-apiserver, kube-scheduler, KWOK)."""

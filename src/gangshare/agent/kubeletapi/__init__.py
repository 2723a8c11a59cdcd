"""The kubelet's device-plugin (v1beta1) and PodResources (v1) gRPC stubs.

Generated at build time from k8s.io/kubelet's api.proto by `scripts/gen-kubelet-api.sh`
(`make protos`); the generated modules are build output and not committed.
"""

"""The node agent: NVML discovery, the kubelet device plugin and the local coordinator."""

"""Thin helpers that turn core objects into Kubernetes manifests and back."""

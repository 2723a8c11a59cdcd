"""gangshare: gang scheduling and GPU sharing for deep-learning training on Kubernetes."""

__version__ = "0.1.0"

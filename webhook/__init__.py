"""gpu-webhook: a Kubernetes admission webhook for GPU resources."""

__version__ = "0.2.0"

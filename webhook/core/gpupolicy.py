"""The policy as a custom resource: ``GPUPolicy`` (``gpu-webhook.io/v1alpha1``, cluster-scoped). The one that
enforces is named ``default``; its ``spec`` is the policy file's format, key for key."""

from __future__ import annotations

GROUP = "gpu-webhook.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPUPolicy"
PLURAL = "gpupolicies"
SINGULAR = "gpupolicy"
# The object both engines read: the webhook watches it, the generated policies' bindings name it in paramRef.
NAME = "default"
# Where the webhook finds it: the cluster-scoped collection, one object by field selector.
PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"

"""The policy file's schema and defaults: every key and its default, the platform presets, each rule's setting.

The rules' settings (``checks.*``, ``cluster.*``, ``dra.*``) come from the rule table (``webhook.core.catalog``);
the policy is read and checked against :data:`SCHEMA` in ``webhook.core.policyfile``, and resolved per namespace
in ``webhook.core.policy``.
"""

from __future__ import annotations

from typing import Any

from webhook.core import catalog

# The namespaces every engine leaves alone by default: the control plane's own. The chart's webhooks also leave out
# their release's namespace and the namespaces its values add.
EXCLUDED_NAMESPACES = ("kube-system", "kube-node-lease")

# The namespaces where the platform's node agents install by their projects' documented defaults: the GPU stack
# (NVIDIA GPU Operator, on OpenShift too; the NVIDIA device plugin and DRA driver; Node Feature Discovery; the AMD
# GPU Operator; Intel's device plugins operator), CNIs (Calico's operator and its nodes, Flannel) and storage
# node plugins (Longhorn, Rook). docs/isolation.md says who the isolation rules are for and why by namespace.
PLATFORM_NAMESPACES = (
    "gpu-operator", "nvidia-gpu-operator", "nvidia-device-plugin", "nvidia-dra-driver-gpu", "node-feature-discovery",
    "kube-amd-gpu", "inteldeviceplugins-system",
    "calico-system", "tigera-operator", "kube-flannel",
    "longhorn-system", "rook-ceph",
)

DEFAULTS: dict[str, Any] = {
    "platform": "generic",
    "resources": ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/*", "nvidia.com/mig-*"],
    "accelerator": {
        "nodeLabel": "accelerator",
        "annotation": "gpu-webhook/accelerator",
        "allowed": [],
        "default": "",
    },
    "gpuTaints": [],
    "limits": {"perContainer": 0, "perPod": 0},
    "tolerations": False,
    "enforcement": "deny",
    "isolation": {
        "hideGpus": "off",
        "runtimeClass": "",
        "trusted": {"namespaces": [], "serviceAccounts": []},
        # Where the platform's own node agents run (docs/isolation.md, "Who the rules are for"): trusted like
        # isolation.trusted, kept apart so that a policy's own trusted list does not drop them.
        "platformNamespaces": list(PLATFORM_NAMESPACES),
        # Where a tenant rule denies a pod that asks for no GPU (elsewhere it warns): names, or `prefix*` globs.
        "tenantNamespaces": [],
        # When the NVIDIA runtime reads NVIDIA_VISIBLE_DEVICES: legacy, in every pod (the runtime is the nodes'
        # default, or CRI-O's hook); cdi (GPU Operator v25.10 and later), only under a RuntimeClass nvidia*.
        "nvidiaRuntime": "legacy",
    },
    # Each rule's setting, from the rule table.
    "checks": {rule.key: rule.default for rule in catalog.in_section("checks")},
    "cluster": {"enabled": False, **{rule.key: rule.default for rule in catalog.in_section("cluster")}},
    "dra": {
        # Device classes whose devices are GPUs (globs): they count toward the caps, get the accelerator
        # selector and tolerations, and clash with a GPU in limits. The vendors' DRA drivers' classes.
        "gpuClasses": ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com"],
        "allowedDeviceClasses": [],
        "adminAccessNamespaces": [],
        **{rule.key: rule.default for rule in catalog.in_section("dra")},
    },
    # Namespaces no engine looks at: the chart's webhooks, the generated policies and `check` leave them alone.
    "excludeNamespaces": list(EXCLUDED_NAMESPACES),
    # For `gpu-webhook admission-policies` (webhook.native reads them): custom kinds with pod templates, and the
    # namespaces the generated policies leave alone beyond excludeNamespaces.
    "nativePolicies": {"customKinds": [], "excludeNamespaces": [], "params": "live"},
    "namespaces": {},
}
_DRA_LISTS = ("gpuClasses", "allowedDeviceClasses", "adminAccessNamespaces")

# What each platform labels and taints its GPU nodes with (shared/notes/gpu-landscape-2026.md section 5).
# `platform: gke` stands for these keys; keys written in the policy still override them.
PLATFORMS: dict[str, dict[str, Any]] = {
    "generic": {},
    # GKE labels the model and, when a GPU pool joins a cluster with other pools, taints nvidia.com/gpu=present
    # (older pools: true); no value here, so the toleration is Exists and covers both.
    "gke": {
        "accelerator": {"nodeLabel": "cloud.google.com/gke-accelerator"},
        "gpuTaints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
    },
    # Karpenter's label; EKS taints nothing by itself, its GPU guide adds nvidia.com/gpu:NoSchedule.
    "eks": {
        "accelerator": {"nodeLabel": "karpenter.k8s.aws/instance-gpu-name"},
        "gpuTaints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
    },
    # AKS names the vendor (nvidia), not the model; its GPU guide taints sku=gpu:NoSchedule.
    "aks": {
        "accelerator": {"nodeLabel": "kubernetes.azure.com/accelerator"},
        "gpuTaints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
    },
    # GPU Feature Discovery's product label (Tesla-T4, A100-SXM4-40GB); taints are the cluster's own.
    "gpu-operator": {"accelerator": {"nodeLabel": "nvidia.com/gpu.product"}},
}

# The namespaces a platform preset trusts whatever the policy's lists say: what the GPU Operator installs runs there.
PLATFORM_TRUSTS: dict[str, tuple[str, ...]] = {"gpu-operator": ("gpu-operator", "nvidia-gpu-operator")}

# Settings of the rules that have one, by the rule id their violations carry. Every other rule follows
# ``enforcement``; these have a setting of their own, which ``enforcement: warn`` still softens.
CHECK_SETTINGS = {rule.id: (rule.section, rule.key) for rule in catalog.RULES.values() if rule.section}

_ENFORCEMENT = {"enum": ["deny", "warn"]}
# YAML 1.1 reads a bare `off` as false; accept it rather than make every user quote it.
_SETTING = {"enum": ["deny", "warn", "off", False]}
_COUNT = {"type": "integer", "minimum": 0}
_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
_LIMITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"perContainer": _COUNT, "perPod": _COUNT},
}
_DNS_LABEL = "[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = "[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
# YAML 1.1 reads a bare `off` as false here too.
_HIDE_GPUS = {"enum": ["void", "none", "off", False]}
_RUNTIME_CLASS = {"type": "string", "pattern": f"^(?:{_DNS_SUBDOMAIN})?$"}
# A namespace name, a prefix of one followed by `*`, or `*` alone (every namespace).
_NAMESPACE_PATTERN = {"type": "string", "pattern": f"^(?:{_DNS_LABEL}|[a-z0-9][-a-z0-9]{{0,61}}\\*|\\*)$"}
_CHECKS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {key: _SETTING for key in DEFAULTS["checks"]},
}
_CLUSTER_SETTINGS = {key: _SETTING for key in DEFAULTS["cluster"] if key != "enabled"}
_TAINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["key"],
    "properties": {
        "key": {"type": "string", "minLength": 1},
        "value": {"type": "string"},
        "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
    },
}

# The settings a namespace may override as they are, in the order both levels list them.
_PER_NAMESPACE = {"limits": _LIMITS, "tolerations": {"type": "boolean"}, "enforcement": _ENFORCEMENT}

# nativePolicies: what `gpu-webhook admission-policies` needs beyond the rules (webhook.native reads it). A
# template path is dot-separated field names, `*` for every value of a map, `name[*]` for every item of a list.
_TEMPLATE_PATH = {
    "type": "string",
    "pattern": r"^[A-Za-z0-9_-]+(?:\[\*\])?(?:\.(?:[A-Za-z0-9_-]+(?:\[\*\])?|\*))*$",
}
_NATIVE_POLICIES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "customKinds": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["group", "resource"],
                # pod templates, resource blocks ({limits, requests} an operator copies into its pods), or both;
                # check and the webhook know an object by its kind, so blocks need it
                "anyOf": [{"required": ["templates"]}, {"required": ["resources", "kind"]}],
                "properties": {
                    "group": {"type": "string", "pattern": f"^{_DNS_SUBDOMAIN}$"},
                    "version": {"type": "string", "pattern": "^(?:[a-z0-9]+|\\*)$"},
                    "resource": {"type": "string", "pattern": f"^{_DNS_LABEL}$"},
                    "kind": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$"},
                    "templates": {"type": "array", "minItems": 1, "items": _TEMPLATE_PATH},
                    "resources": {"type": "array", "minItems": 1, "items": _TEMPLATE_PATH},
                },
            },
        },
        "excludeNamespaces": {"type": "array", "items": {"type": "string", "pattern": f"^{_DNS_LABEL}$"}},
        # live: the generated policies read GPUPolicy/default through params; inline: its values written into them
        "params": {"enum": ["live", "inline"]},
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "gpu-webhook policy",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "platform": {"enum": list(PLATFORMS)},
        "resources": {**_STRINGS, "minItems": 1},
        "accelerator": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "nodeLabel": {"type": "string", "minLength": 1},
                "annotation": {"type": "string", "minLength": 1},
                "allowed": _STRINGS,
                "default": {"type": "string"},
            },
        },
        "gpuTaints": {"type": "array", "items": _TAINT},
        **_PER_NAMESPACE,
        "isolation": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "hideGpus": _HIDE_GPUS,
                "runtimeClass": _RUNTIME_CLASS,
                "platformNamespaces": {
                    "type": "array", "items": {"type": "string", "pattern": f"^{_DNS_LABEL}$"}, "uniqueItems": True,
                },
                "tenantNamespaces": {"type": "array", "items": _NAMESPACE_PATTERN, "uniqueItems": True},
                "nvidiaRuntime": {"enum": ["legacy", "cdi"]},
                "trusted": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "namespaces": {"type": "array", "items": {"type": "string", "pattern": f"^{_DNS_LABEL}$"}},
                        "serviceAccounts": {
                            "type": "array",
                            "items": {"type": "string", "pattern": f"^{_DNS_LABEL}/{_DNS_SUBDOMAIN}$"},
                        },
                    },
                },
            },
        },
        "checks": _CHECKS,
        "cluster": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"enabled": {"type": "boolean"}, **_CLUSTER_SETTINGS},
        },
        "dra": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                **{key: _STRINGS for key in _DRA_LISTS},
                **{key: _SETTING for key in DEFAULTS["dra"] if key not in _DRA_LISTS},
            },
        },
        "excludeNamespaces": {"type": "array", "items": {"type": "string", "pattern": f"^{_DNS_LABEL}$"}},
        "nativePolicies": _NATIVE_POLICIES,
        "namespaces": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "accelerator": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"allowed": _STRINGS, "default": {"type": "string"}},
                    },
                    **_PER_NAMESPACE,
                    "isolation": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"hideGpus": _HIDE_GPUS, "runtimeClass": _RUNTIME_CLASS},
                    },
                    "checks": _CHECKS,
                    "cluster": {"type": "object", "additionalProperties": False, "properties": _CLUSTER_SETTINGS},
                    "dra": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"allowedDeviceClasses": _STRINGS},
                    },
                },
            },
        },
    },
}

// Test workloads for the e2e node bed (tests/e2e/node.py); standard library only.
module gpu-webhook.invalid/e2e-images

go 1.26

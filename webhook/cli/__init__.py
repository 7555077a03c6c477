"""The ``gpu-webhook`` command: serve, certs, check, audit and admission-policies."""

# gpu-webhook: the admission webhook server (`gpu-webhook serve`), also usable for `certs` and `check`.
# The Helm chart in charts/gpu-webhook runs it read-only as user 65532 with /tmp on an emptyDir.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package build needs (see .dockerignore); the sources are removed after install.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY webhook ./webhook
RUN pip install --no-cache-dir . && rm -rf /src

WORKDIR /
# A numeric non-root user, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
# HTTPS: POST /validate and /mutate, GET /healthz, /readyz and /metrics.
EXPOSE 8443
ENTRYPOINT ["gpu-webhook"]
# Without arguments: a throw-away self-signed certificate for localhost, to try the server out.
CMD ["serve", "--self-signed"]

# gpu-webhook: the admission webhook server (`gpu-webhook serve`), also usable for `certs` and `check`.
# The Helm chart in charts/gpu-webhook runs it read-only as user 65532 with /tmp on an emptyDir.
#
#   docker build -t gpu-webhook .       # or: buildah bud -t gpu-webhook .
#   docker run --rm -p 127.0.0.1:8443:8443 gpu-webhook
#   curl -k https://localhost:8443/healthz   # -k: a throw-away CA, whose path inside the container is logged
#
# One file for both builders: it uses only what Docker's classic builder, BuildKit and buildah all take
# (no `# syntax=` line, no RUN --mount, no heredocs, no COPY --chmod/--link, no automatic platform ARGs).
# Verified where this project is developed, which has no Docker engine: `buildah bud` (buildah 1.28) through
# tests/image/build-image.sh, FROM a Debian bookworm base it makes, and the resulting image's config and
# behaviour by tests/image (including that the default command listens on all interfaces); the portability
# rules above by a static test of this file. Not run here: `docker build` itself, and a build FROM the
# default BASE below (no registry reachable).
#
# BASE is the image of both stages, so the venv made in the builder finds its interpreter at the same path
# at run time (/usr/local/bin/python3 in the public Python slim image, /usr/bin/python3 in Debian's python3).
# The default is the public Python 3.11 slim image on Debian bookworm, pinned by the digest of its
# multi-platform index; change tag and digest together. The digest was taken from public projects that pin
# this tag and could not be checked against the registry where this file was written: verify it with
#   skopeo inspect --raw docker://python:3.11.15-slim-bookworm | sha256sum
# (the sum is the digest). The tests build FROM a Debian bookworm base made by tests/image/build-base.sh
# (--build-arg BASE=localhost/gpu-webhook-base:bookworm); any base with python3 3.11 and its venv module works.
ARG BASE=python:3.11.15-slim-bookworm@sha256:d29f48a31a8b408ed19272ca1e7b10ebae13b240a27e862d3d4217c528e2e0c3

FROM ${BASE} AS builder
# Only for building behind a TLS-intercepting proxy (a CA bundle mounted into the build) or from a PyPI
# mirror; unset by default, and this stage is not part of the image.
ARG PIP_CERT
ARG PIP_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/gpu-webhook
# The dependencies, exactly as locked: wheels only (no compiler anywhere), every file checked against the
# lock's hashes, nothing resolved here. Regenerate the lock with the command in its header.
COPY requirements/image.lock /tmp/image.lock
RUN /opt/gpu-webhook/bin/pip install --require-hashes --no-deps --only-binary=:all: -r /tmp/image.lock
# The package itself, built by the locked setuptools (no build isolation, no index: nothing unhashed is
# fetched); then what only installing needed goes: pip, setuptools, wheel.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY webhook ./webhook
RUN /opt/gpu-webhook/bin/pip install --no-deps --no-build-isolation --no-index . \
 && /opt/gpu-webhook/bin/pip uninstall --yes setuptools \
 && rm -rf /opt/gpu-webhook/bin/pip* /opt/gpu-webhook/lib/python3*/site-packages/pip \
           /opt/gpu-webhook/lib/python3*/site-packages/pip-*.dist-info \
           /opt/gpu-webhook/lib/python3*/site-packages/wheel /opt/gpu-webhook/lib/python3*/site-packages/wheel-*.dist-info \
 && /opt/gpu-webhook/bin/python3 -c "import importlib.util as u, sys; \
left = [m for m in ('pip', 'setuptools', 'wheel', '_distutils_hack') if u.find_spec(m)]; \
sys.exit(f'still in the venv: {left}' if left else 0)" \
 && /opt/gpu-webhook/bin/gpu-webhook --version

FROM ${BASE}
# Nothing can install packages at run time: no pip, setuptools or wheel, no ensurepip and its bundled wheels
# (the public image has them under /usr/local, Debian's python3-venv under /usr/lib and /usr/share).
RUN rm -rf /usr/local/bin/pip /usr/local/bin/pip3* /usr/local/bin/wheel /usr/bin/pip /usr/bin/pip3* \
           /usr/local/lib/python3*/site-packages/pip /usr/local/lib/python3*/site-packages/pip-*.dist-info \
           /usr/local/lib/python3*/site-packages/setuptools /usr/local/lib/python3*/site-packages/setuptools-*.dist-info \
           /usr/local/lib/python3*/site-packages/pkg_resources /usr/local/lib/python3*/site-packages/_distutils_hack \
           /usr/local/lib/python3*/site-packages/distutils-precedence.pth \
           /usr/local/lib/python3*/site-packages/wheel /usr/local/lib/python3*/site-packages/wheel-*.dist-info \
           /usr/local/lib/python3*/ensurepip /usr/lib/python3*/ensurepip /usr/share/python-wheels \
 && python3 -c "import importlib.util as u, sys; \
left = [m for m in ('pip', 'setuptools', 'wheel', 'ensurepip') if u.find_spec(m)]; \
sys.exit(f'still in the image: {left}' if left else 0)"
COPY --from=builder /opt/gpu-webhook /opt/gpu-webhook
# Read-only root filesystem: no bytecode written at run time (the venv's is compiled at install), and
# everything the server writes (its throw-away CA, Prometheus multiprocess files, gunicorn's heartbeat
# files) goes under /tmp.
ENV PATH=/opt/gpu-webhook/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /
# A numeric non-root user, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
# HTTPS: POST /validate and /mutate, GET /healthz, /readyz and /metrics.
EXPOSE 8443
ENTRYPOINT ["gpu-webhook"]
# Without arguments: a throw-away self-signed certificate (for localhost; its CA's path inside the container
# is logged), to try the server out. It listens on all interfaces: `serve --self-signed` alone binds
# 127.0.0.1, which inside a container is the container's own loopback, where a published port
# (`docker run -p`) never arrives. That is safe here because the container's interfaces are its own, reached
# only through the ports you publish (publish on 127.0.0.1, as above, to keep it on your machine); on a
# laptop, outside a container, 0.0.0.0 would offer this throw-away server to the whole network, which is why
# the CLI keeps 127.0.0.1 as its --self-signed default. The Helm chart passes its own arguments (its
# certificate, 0.0.0.0 by default without --self-signed) and never uses this command.
CMD ["serve", "--self-signed", "--host", "0.0.0.0"]

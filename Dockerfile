# syntax=docker/dockerfile:1
# colbert-train: the image every pod of a colbert-k8s job runs, and `docker run --gpus all` on one box.
#
# Base: the official PyTorch runtime image of the torch version PyLate 1.6.0 pins (2.11.0, via
# fast-plaid), so the CUDA build of torch comes with the base instead of a second multi-GB copy.
# BASE_IMAGE may name any image with that torch importable by `python` (scripts/image-test.sh builds
# an offline stand-in); the venv below reuses it through --system-site-packages.
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime

FROM ${BASE_IMAGE} AS build
# A CA bundle for pip behind a TLS-inspecting proxy (mounted at build time; unset by default).
ARG PIP_CERT
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY trainer ./trainer
COPY operator_cli ./operator_cli
# A venv on top of the base's site-packages: torch is reused, everything else is pinned by the lock.
RUN python -m venv --system-site-packages /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --constraint requirements.lock ".[train,vectordb]"
# The KServe predictor (`colbert-k8s serve`: /opt/serve/bin/python -m trainer.serve), in a venv layered on
# /opt/venv: kserve 0.21 pins python-dateutil<3, the CLI's kubernetes client >=3. It sees its own packages
# first, then /opt/venv's (the trainer, pylate), then the base's torch.
COPY requirements-serve.txt ./
RUN python -m venv --system-site-packages /opt/serve \
 && train_site=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && serve_site=$(/opt/serve/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && echo "import site; site.addsitedir('${train_site}')" > "${serve_site}/colbert-k8s-train.pth" \
 && /opt/serve/bin/pip install --no-cache-dir -r requirements-serve.txt

FROM ${BASE_IMAGE} AS runtime
ARG VERSION=0.4.0
LABEL org.opencontainers.image.title="colbert-train" \
      org.opencontainers.image.description="Distributed ColBERT training with PyLate for Kubeflow PyTorchJobs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/colbert-k8s/colbert-k8s" \
      org.opencontainers.image.base.name="docker.io/pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime"
# UID/GID 1000 match runAsUser/runAsGroup/fsGroup in the CLI's and the chart's securityContext.
RUN groupadd --gid 1000 colbert \
 && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/colbert --shell /usr/sbin/nologin colbert \
 && mkdir -p /workspace /home/colbert/.cache/huggingface \
 && chown -R 1000:1000 /workspace /home/colbert
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/serve /opt/serve
ENV PATH="/opt/venv/bin:${PATH}" \
    HOME=/home/colbert \
    HF_HOME=/home/colbert/.cache/huggingface \
    PYTHONUNBUFFERED=1
WORKDIR /workspace
USER 1000:1000
# With GPUs visible and no launcher variables, the trainer starts one process per GPU itself.
ENTRYPOINT ["colbert-train"]
CMD ["--help"]

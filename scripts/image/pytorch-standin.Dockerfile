# An offline stand-in for pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime, which cannot be pulled on a
# machine without registry access: a debootstrap'd Debian bookworm (imported by scripts/image-test.sh)
# with the same torch (PyPI's CUDA build, which runs on CPU) in the interpreter's own site-packages,
# and `python` on PATH, as conda's /opt/conda/bin/python has it in the real image. It must not be a
# venv: a venv made from a venv with --system-site-packages sees the *base* interpreter's packages,
# so the project's venv would not see torch (the first run of image-test.sh found exactly that).
# What it lacks against the real base: conda itself, the CUDA driver libraries the NVIDIA runtime
# injects (no GPU here either), and Ubuntu's package set.
ARG ROOTFS_IMAGE=localhost/ck8s-debootstrap:bookworm
FROM ${ROOTFS_IMAGE}
ARG TORCH_VERSION=2.11.0
ARG PIP_CERT
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN site="$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
 && python3 -m venv /tmp/installer \
 && /tmp/installer/bin/pip install --no-cache-dir --progress-bar off --target "$site" "torch==${TORCH_VERSION}" \
 && rm -rf /tmp/installer \
 && ln -s /usr/bin/python3 /usr/local/bin/python \
 && python -c "import torch; print('torch', torch.__version__, 'in', torch.__file__)"

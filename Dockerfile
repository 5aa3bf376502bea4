# The tpuserve image: operator (`tpuserve operator`), router (`tpuserve router`) and the simulated
# engine (`tpuserve engine sim`), plus the chart's `helm test` check (python on PATH).
# Model servers on TPU nodes use sglang_tpu/Dockerfile (torch-tpu and SGLang) instead.
#   docker build -t ghcr.io/tpuserve/tpuserve:0.1.0 .
FROM python:3.11-slim-bookworm AS build
# The router's block index is compiled Rust (router/native): cargo, and gcc to link it.
COPY --from=rust:1.95-slim-bookworm /usr/local/cargo /usr/local/cargo
COPY --from=rust:1.95-slim-bookworm /usr/local/rustup /usr/local/rustup
ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup PATH=/usr/local/cargo/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md hatch_build.py .gitignore ./
COPY scripts/build_native.py ./scripts/
COPY sglang_tpu ./sglang_tpu
COPY tpuserve ./tpuserve
COPY operator ./operator
COPY router ./router
RUN python -m venv /opt/tpuserve \
 && /opt/tpuserve/bin/pip install --no-cache-dir --upgrade "pip>=24" \
 && /opt/tpuserve/bin/pip install --no-cache-dir .

FROM python:3.11-slim-bookworm
COPY --from=build /opt/tpuserve /opt/tpuserve
ENV PATH=/opt/tpuserve/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Non-root and read-only root filesystem friendly: nothing is written outside /tmp.
USER 65532:65532
ENTRYPOINT ["tpuserve"]
CMD ["--help"]

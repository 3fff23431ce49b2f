# lmi on an NVIDIA GPU (CUDA 13: driver 580 or newer). The runtime base carries cuBLAS and
# NVRTC, which compiles the kernels at start (cached in LMI_KERNEL_CACHE). No model is baked in:
# mount one at /opt/ml/model (with its serving.properties) or set HF_MODEL_ID to a directory.
#
#   docker build -f deploy/docker/cuda.Dockerfile -t lmi:cuda .
#   docker run --gpus all -p 8080:8080 -v /models/llama-3.1-8b:/opt/ml/model:ro lmi:cuda serve
#
# The CUDA engine needs no CUDA toolkit to build (cudarc loads the libraries at run time), so the
# build stage is the same Rust image as the CPU one.
ARG BUILD_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=docker.io/nvidia/cuda:13.0.1-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
RUN deploy/docker/build-stage.sh /out

FROM ${RUNTIME_IMAGE}
# The runtime image's cuda-libraries carry cudart, cuBLAS and NVRTC: all the engine loads.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 lmi \
    && useradd --system --uid 10001 --gid lmi --home-dir /home/lmi --create-home --shell /usr/sbin/nologin lmi \
    && mkdir -p /opt/ml/model
COPY --from=build /out/lmi /usr/local/bin/lmi
ENV LMI_KERNEL_CACHE=/tmp/lmi-kernels \
    LMI_CUDA_LIB_DIR=/usr/local/cuda/lib64 \
    OPTION_DEVICE=cuda
USER 10001:10001
WORKDIR /home/lmi
EXPOSE 8080
# SageMaker multi-model endpoints take containers that say so (SAGEMAKER_MULTI_MODEL=true
# then starts the server with no model; docs/deploy.md, "Several models in one server").
LABEL com.amazonaws.sagemaker.capabilities.multi-models=true
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/lmi"]
CMD ["serve"]

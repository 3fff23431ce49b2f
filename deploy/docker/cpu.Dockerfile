# lmi on the CPU, with the default model (SmolLM2-135M-Instruct) baked in: it starts with no
# network. SageMaker's contract: `docker run IMAGE serve`, port 8080 (or SAGEMAKER_BIND_TO_PORT),
# /ping and /invocations, the model from /opt/ml/model or HF_MODEL_ID, OPTION_* variables.
#
#   docker build -f deploy/docker/cpu.Dockerfile -t lmi:cpu .
#
# BUILD_IMAGE needs Rust 1.95 (Debian's is older). CI builds with a local Debian base as
# BUILD_IMAGE and the binary and model given in deploy/docker/prebuilt/ (docs/deploy.md).
ARG BUILD_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
RUN deploy/docker/build-stage.sh /out model

FROM ${RUNTIME_IMAGE}
# CA certificates from the build stage: the runtime stage installs nothing.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN groupadd --system --gid 10001 lmi \
    && useradd --system --uid 10001 --gid lmi --home-dir /home/lmi --create-home --shell /usr/sbin/nologin lmi \
    && mkdir -p /opt/ml/model
COPY --from=build /out/lmi /usr/local/bin/lmi
# Owned by the server's user: a GGUF named on the Hub has its config imported there.
COPY --from=build --chown=10001:10001 /out/models /opt/lmi/models
ENV LMI_MODEL_CACHE=/opt/lmi/models \
    LMI_KERNEL_CACHE=/tmp/lmi-kernels \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    OPTION_DEVICE=cpu
USER 10001:10001
WORKDIR /home/lmi
EXPOSE 8080
# SageMaker multi-model endpoints take containers that say so (SAGEMAKER_MULTI_MODEL=true
# then starts the server with no model; docs/deploy.md, "Several models in one server").
LABEL com.amazonaws.sagemaker.capabilities.multi-models=true
# SIGTERM drains (option.drain_timeout, 60 s): orchestrators' grace periods must be longer.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/lmi"]
CMD ["serve"]

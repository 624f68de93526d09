# The duplex image: agent workers (`duplex serve`) and recognizer replicas (`duplex asr-serve`)
# run the same image with different arguments (deploy/kubernetes/). Built with the README's
# set-up script, so the image has what a laptop install has, models included (offline).
#   docker build -t duplex:latest .
#   docker run -e DUPLEX_AUTH_TOKEN=$(openssl rand -hex 16) -p 8080:8080 duplex:latest
# The token is required: `duplex serve` refuses to listen on 0.0.0.0 without one (docs/serving.md).
# For the Kyutai engine on GPU nodes, start from a CUDA base instead, e.g.
#   docker build --build-arg BASE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 -t duplex:gpu .
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
# the models made at set-up (the default LLM's requantized file) must be where the duplex user looks
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 DUPLEX_CACHE=/opt/duplex/.cache/duplex
RUN apt-get update -q && apt-get install -y -q --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/duplex
COPY . .
RUN scripts/setup.sh && rm -rf /root/.cache/pip /var/lib/apt/lists/*
RUN useradd --system --home /opt/duplex duplex && chown -R duplex /opt/duplex
USER duplex
EXPOSE 8080
# SIGTERM drains (both commands): give the container a grace period above --drain-timeout
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/duplex/.venv/bin/duplex"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]

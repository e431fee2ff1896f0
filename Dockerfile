# fp8train on CUDA 13: build image with the OS packages, the project built in /opt/fp8train.
# docker build -t fp8train . && docker run --gpus all -v $PWD/data:/opt/fp8train/data fp8train \
#   train --config configs/gpt2-124m-fp8.yaml
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive NCCL_NVLS_ENABLE=0
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config git ca-certificates nodejs npm \
      libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev \
      libopenmpi-dev openmpi-bin libpcre2-dev libcatch2-dev libnccl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/fp8train
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a;80" \
    && cmake --build build -j"$(nproc)"
ENTRYPOINT ["/opt/fp8train/build/fp8train"]
CMD ["--help"]

#!/usr/bin/env bash
# Sets up fp8train on a fresh Debian 12 / Ubuntu 24.04 machine, idempotently:
# installs the packages, configures and builds into build/, and prepares the Brown corpus in data/.
# Environment: FP8T_CUDA=ON|OFF (default: ON when nvcc is found), FP8T_SKIP_APT=1, FP8T_SKIP_DATA=1,
# FP8T_BUILD_DIR (default build), FP8T_JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

install_packages() {
  local pkgs=(build-essential cmake pkg-config git ca-certificates curl nodejs npm
              libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
              libopenmpi-dev openmpi-bin libpcre2-dev libomp-dev)
  # The plot test (python3-matplotlib) and the Slurm test's one-node cluster. Installing these starts no
  # daemon in a container (no init; Docker's policy-rc.d); scripts/slurm/local_cluster.sh runs its own.
  pkgs+=(python3-matplotlib slurmctld slurmd slurm-client munge)
  # The sanitizer + fuzz job (tests/fuzz/sanitize.sh, run by .ci/run) needs clang 16 or newer (C++20 lambdas
  # that capture structured bindings), its ASan/UBSan/libFuzzer runtimes (libclang-rt) and llvm-symbolizer
  # (llvm) for symbolized stacks. Elsewhere it skips. Both are in Debian 12's main archive.
  local llvm=""
  case "$(. /etc/os-release && echo "${VERSION_CODENAME:-}")" in bookworm) llvm=16 ;; noble) llvm=18 ;; esac
  # Not libomp-$llvm-dev: on Debian 12 it conflicts with libomp-dev (libomp-14-dev) above, so apt would remove
  # one for the other on every run. clang 16 builds against LLVM 14's libomp instead (sanitize.sh sets it up).
  if [ -n "$llvm" ]; then pkgs+=("clang-$llvm" "libclang-rt-$llvm-dev" "llvm-$llvm"); fi
  local missing=()
  for p in "${pkgs[@]}" libcatch2-dev; do
    # node and npm may come from outside apt (nodesource, nvm): present is enough.
    if [ "$p" = nodejs ] && command -v node >/dev/null 2>&1; then continue; fi
    if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  # Catch2 must be v3: Debian 12 ships v2, bookworm-backports has v3.
  if dpkg-query -W -f='${Version}' libcatch2-dev 2>/dev/null | grep -q '^2\.'; then missing+=(libcatch2-dev); fi
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  . /etc/os-release
  if [ "${VERSION_CODENAME:-}" = bookworm ] && ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
  fi
  $SUDO apt-get update -qq
  # npm/nodejs may already come from elsewhere (nodesource): don't fight it.
  local apt_pkgs=()
  for p in "${pkgs[@]}"; do
    if { [ "$p" = nodejs ] || [ "$p" = npm ]; } && command -v "$p" >/dev/null 2>&1; then continue; fi
    if [ "$p" = nodejs ] && command -v node >/dev/null 2>&1; then continue; fi
    apt_pkgs+=("$p")
  done
  $SUDO apt-get install -y -qq "${apt_pkgs[@]}"
  if [ "${VERSION_CODENAME:-}" = bookworm ]; then
    $SUDO apt-get install -y -qq -t bookworm-backports libcatch2-dev
  else
    $SUDO apt-get install -y -qq libcatch2-dev
  fi
}

[ "${FP8T_SKIP_APT:-0}" = 1 ] || install_packages

BUILD="${FP8T_BUILD_DIR:-build}"
JOBS="${FP8T_JOBS:-$(nproc)}"
CMAKE_ARGS=(-S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release)
if [ -n "${FP8T_CUDA:-}" ]; then CMAKE_ARGS+=(-DFP8T_CUDA="$FP8T_CUDA"); fi
if [ -z "${FP8T_CUDA:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
cmake "${CMAKE_ARGS[@]}" >/dev/null
cmake --build "$BUILD" -j "$JOBS"

if [ "${FP8T_SKIP_DATA:-0}" != 1 ]; then
  FP8T_BIN="$BUILD/fp8train" bash scripts/prepare_data.sh
fi
echo "setup: done (binary: $BUILD/fp8train)"

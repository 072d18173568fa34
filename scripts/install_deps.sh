#!/usr/bin/env bash
# Installs (on Debian/Ubuntu, with apt) what building and testing needs, skipping what is present:
#   g++ make            build
#   libpcre2-dev        the tokenizer's Unicode regular expressions
#   libgtest-dev        the C++ test suites
#   python3-torch python3-numpy libopenblas0-pthread
#                       the PyTorch oracle the tests compare against (Debian's torch is CPU-only and
#                       is seen by /usr/bin/python3; OpenBLAS with pthreads keeps its matmuls fast)
#   nodejs npm          the reference GPT-2 encoder (npm's gpt-3-encoder) the tokenizer is tested against
#   openmpi-bin libopenmpi-dev
#                       multi-process (data-parallel) runs and their tests
# Usage: scripts/install_deps.sh [--check]   (--check only reports what is missing, exit 1 if anything)
set -euo pipefail

packages=(g++ make pkg-config libpcre2-dev libgtest-dev python3-torch python3-numpy libopenblas0-pthread nodejs npm
          openmpi-bin libopenmpi-dev)
missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        # node and npm may come from elsewhere (nvm, nodesource): accept them on PATH
        if { [ "$p" = nodejs ] && command -v node >/dev/null; } || { [ "$p" = npm ] && command -v npm >/dev/null; }; then
            continue
        fi
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install_deps: all dependencies present"
    exit 0
fi
if [ "${1:-}" = "--check" ]; then
    echo "install_deps: missing: ${missing[*]}" >&2
    exit 1
fi
echo "install_deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"

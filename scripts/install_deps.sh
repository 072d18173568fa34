#!/usr/bin/env bash
# Installs what building, training and testing need, skipping what is present.
#
# From Debian/Ubuntu's packages (apt), for the C++ side:
#   g++ make pkg-config      build
#   libpcre2-dev             the tokenizer's Unicode regular expressions
#   libgtest-dev             the C++ test suites
#   openmpi-bin libopenmpi-dev   multi-process (data-parallel) runs and their tests
#   libboost-context-dev     the fibers of the CUDA emulation (dev/emu: CUDA threads on the CPU) off
#                            x86-64, linked only there (dev/emu/fiber_switch.h has x86-64's own switch)
#   libtsan2                 ThreadSanitizer, the emulator's race checker (comes with g++ 12 and 13)
#   python3 python3-venv     only to make the Python environment below
# From PyPI, into a virtual environment in the repository (.venv, git-ignored), the versions pinned in
# requirements.txt: PyTorch (the oracle the tests compare against, and the benchmarks' peer), NumPy,
# tiktoken (the tokenizer's reference), safetensors, transformers, matplotlib. Training needs none of
# it: `--no-python` skips it (the main job uses that).
#
# Usage: scripts/install_deps.sh [--check] [--no-python] [--bench]
#   --check      only report what is missing (exit 1 if anything is)
#   --no-python  the C++ side only
#   --bench      also libopenblas-dev, the peer of `make bench-gemm` (nothing else links it)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
check=0
python_side=1
bench=0
for arg in "$@"; do
    case "$arg" in
        --check) check=1 ;;
        --no-python) python_side=0 ;;
        --bench) bench=1 ;;
        *) echo "install_deps: unknown option '$arg' (use --check, --no-python, --bench)" >&2; exit 2 ;;
    esac
done

packages=(g++ make pkg-config libpcre2-dev libgtest-dev openmpi-bin libopenmpi-dev libboost-context-dev libtsan2)
if [ $python_side -eq 1 ]; then packages+=(python3); fi
if [ $bench -eq 1 ]; then packages+=(libopenblas-dev); fi
missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        # a python3 from elsewhere (pyenv, conda) is fine if it can make a venv
        if [ "$p" = python3 ] && command -v python3 >/dev/null; then continue; fi
        missing+=("$p")
    fi
done
# `python3 -m venv` needs Debian's python3-venv when python3 is Debian's
venv_python=""
if [ $python_side -eq 1 ]; then
    venv_python=$(command -v python3 || echo /usr/bin/python3)
    if [ -x "$venv_python" ] && ! "$venv_python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        missing+=(python3-venv)
    fi
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ $check -eq 1 ]; then
        echo "install_deps: missing packages: ${missing[*]}" >&2
    else
        echo "install_deps: installing ${missing[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

# The Python environment: .venv, rebuilt only when requirements.txt changed (its hash is kept in
# .venv/requirements.sha256 once every package installed).
python_ok=1
if [ $python_side -eq 1 ]; then
    venv="$root/.venv"
    want=$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)
    have=$(cat "$venv/requirements.sha256" 2>/dev/null || true)
    if [ "$want" != "$have" ] || [ ! -x "$venv/bin/python" ]; then
        python_ok=0
        if [ $check -eq 1 ]; then
            echo "install_deps: the Python environment .venv is missing or older than requirements.txt" >&2
        else
            venv_python=$(command -v python3 || echo /usr/bin/python3)
            if ! "$venv_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
                echo "install_deps: $venv_python is Python $("$venv_python" -c 'import sys; print(sys.version.split()[0])'); the pinned packages need 3.11 or newer" >&2
                exit 1
            fi
            echo "install_deps: making .venv with $venv_python and installing requirements.txt from PyPI (several GB: PyTorch brings its CUDA libraries)"
            start=$(date +%s)
            rm -rf "$venv"
            "$venv_python" -m venv "$venv"
            "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
            "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/requirements.txt"
            echo "$want" > "$venv/requirements.sha256"
            echo "install_deps: .venv ready in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)"
            python_ok=1
        fi
    fi
fi

if [ $check -eq 1 ]; then
    if [ ${#missing[@]} -gt 0 ] || [ $python_ok -eq 0 ]; then exit 1; fi
    echo "install_deps: all dependencies present"
    exit 0
fi
echo "install_deps: done"

#!/usr/bin/env bash
# Prints the Python interpreter the tests and benchmarks use: the first of
#   $GPT2_PYTHON, the project's .venv (made by scripts/install_deps.sh), python3 on PATH, /usr/bin/python3
# that imports torch (on GPU machines, the python3 on PATH is the one with torch). If none does, prints
# the first that exists, so the error that follows names a real interpreter.
root="$(cd "$(dirname "$0")/.." && pwd)"
candidates=()
[ -n "${GPT2_PYTHON:-}" ] && candidates+=("$GPT2_PYTHON")
candidates+=("$root/.venv/bin/python" "$(command -v python3 2>/dev/null)" /usr/bin/python3)
first=""
for py in "${candidates[@]}"; do
    [ -n "$py" ] && [ -x "$py" ] || continue
    [ -z "$first" ] && first="$py"
    if "$py" -c 'import torch' >/dev/null 2>&1; then
        echo "$py"
        exit 0
    fi
done
echo "${first:-python3}"

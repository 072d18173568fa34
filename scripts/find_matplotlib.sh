#!/usr/bin/env bash
# Prints the first Python interpreter that imports matplotlib, of $GPT2_PYTHON, the project's .venv,
# python3 on PATH and /usr/bin/python3 (Debian's python3-matplotlib), for dev/plot_metrics.py.
# Prints nothing and exits 1 if none does: plots are optional, and the main job runs without Python.
root="$(cd "$(dirname "$0")/.." && pwd)"
for py in "${GPT2_PYTHON:-}" "$root/.venv/bin/python" "$(command -v python3 2>/dev/null)" /usr/bin/python3; do
    [ -n "$py" ] && [ -x "$py" ] || continue
    if "$py" -c 'import matplotlib' >/dev/null 2>&1; then
        echo "$py"
        exit 0
    fi
done
exit 1

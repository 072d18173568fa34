"""Runs a dev/ script with the Python that has its packages.

scripts/install_deps.sh installs NumPy, matplotlib and the rest into the repository's .venv; a script
started with the system's python3 (as the README shows it) that cannot import what it needs starts
itself again with .venv/bin/python, or says in one line what to run. Call before the imports.
"""
import importlib.util
import os
import sys


def need(*modules):
    """Makes sure `modules` import: re-executes this script under .venv/bin/python when they do not
    here and do there; exits with one line naming the fix when neither has them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv_python = os.path.join(root, ".venv", "bin", "python")
    # (a venv's python is a link to the system's: which one runs shows in sys.prefix, not the executable)
    in_venv = os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(root, ".venv"))
    if os.path.exists(venv_python) and not in_venv and not os.environ.get("REPO_PYTHON_REEXEC"):
        os.environ["REPO_PYTHON_REEXEC"] = "1"  # once: a .venv without the modules must not loop
        os.execv(venv_python, [venv_python] + sys.argv)
    script = os.path.relpath(sys.argv[0])
    sys.exit(f"{script}: needs {', '.join(missing)}, which {sys.executable} cannot import: run scripts/install_deps.sh "
             f"(it installs them into .venv), then python3 {script} again (or .venv/bin/python {script})")

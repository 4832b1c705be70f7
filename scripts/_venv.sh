# Sourced by the scripts: make sure .venv exists with gpu-train installed, then put it on PATH.
# Creating it takes a minute once; later runs only check a stamp (the requirements' hash).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
stamp="$VENV/.gpu-train-stamp"
want="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-test.txt" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setting up $VENV (once) ..." >&2
  python3 -m venv "$VENV" || { echo "python3 -m venv failed: install python3-venv" >&2; exit 1; }
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -r "$ROOT/requirements.txt" -r "$ROOT/requirements-test.txt" -e "$ROOT" >&2 || exit 1
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"

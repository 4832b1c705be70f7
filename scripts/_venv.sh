# Sourced by the scripts: make sure .venv exists with gpu-train installed, then put it on PATH.
# VENV_EXTRAS=test (scripts/test, scripts/demo) adds the test tools and the CPU torch the example
# trains with; the user's install (scripts/setup, plan, preflight, up) has only what gpu-train needs.
# Creating it takes a minute once; later runs only check a stamp per set (the requirements' hash).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
reqs=("$ROOT/requirements.txt")
[ "${VENV_EXTRAS:-}" = test ] && reqs+=("$ROOT/requirements-test.txt")
stamp="$VENV/.gpu-train-stamp$([ "${VENV_EXTRAS:-}" = test ] || echo -user)"
want="$(cat "${reqs[@]}" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setting up $VENV (once) ..." >&2
  python3 -m venv "$VENV" || { echo "python3 -m venv failed: install python3-venv" >&2; exit 1; }
  pip_reqs=()
  for r in "${reqs[@]}"; do pip_reqs+=(-r "$r"); done
  # editable_mode=compat: the checkout on sys.path by a plain .pth line. The default mode installs an
  # import hook that every Python start in this venv loads (about 15 ms each, on every fab and gpu-train).
  # (pip takes --config-settings from 22.1 on; an older one installs the default way.)
  compat=(--config-settings editable_mode=compat)
  "$VENV/bin/python" -c 'import pip, sys; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 1))' \
    2>/dev/null || compat=()
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${pip_reqs[@]}" -e "$ROOT" "${compat[@]}" >&2 || exit 1
  echo "$want" > "$stamp"
  if [ "${VENV_EXTRAS:-}" = test ]; then  # the test set holds the user's: it needs no install of its own
    cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16 > "$VENV/.gpu-train-stamp-user"
  fi
fi
export PATH="$VENV/bin:$PATH"

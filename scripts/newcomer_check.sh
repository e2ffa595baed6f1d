#!/usr/bin/env bash
# The README's run command on a bare machine: a fresh venv with nothing but the install part of
# that command (read from README.md, not copied), then the CLI, the app and a small benchmark from
# it (scripts/newcomer_check.py). Fails if the product needs anything the run command does not
# install. Run by scripts/test.sh (CI); NEWCOMER_CHECK=0 skips it there.
set -euo pipefail
cd "$(dirname "$0")/.."
run=$(grep -m1 -E '^pip install .*&& python app\.py$' README.md) || {
  echo "newcomer check: README.md has no run command line 'pip install ... && python app.py'" >&2; exit 1; }
install=${run% && python app.py}
venv=$(mktemp -d)/venv
trap 'rm -rf "$(dirname "$venv")"' EXIT
python -m venv "$venv"
echo "newcomer check: in a fresh venv: $install"
(PATH="$venv/bin:$PATH"; eval "${install//pip install/python -m pip install -q --disable-pip-version-check}")
"$venv/bin/python" scripts/newcomer_check.py
# Installable: `pip install .` gives the `vegas` and `vegas-studio` commands, run from outside the clone.
(PATH="$venv/bin:$PATH"; python -m pip install -q --disable-pip-version-check --no-deps .)
(cd "$(dirname "$venv")" && "$venv/bin/vegas" generate --prompt "The capital of France is" --max-tokens 4 --json \
  && "$venv/bin/vegas-studio" --help >/dev/null && echo "ok    pip install . gives vegas and vegas-studio")

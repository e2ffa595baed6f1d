"""The product as a user installs it: pins that agree, a layout that coexists with the ecosystem's
packages, and no import of what the run command does not install (Triton is an optional
accelerator). The full bare-venv check is scripts/newcomer_check.sh, run by scripts/test.sh."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            name = re.split(r"[<>=!~ ]", line, maxsplit=1)[0].lower()
            out[name] = line.replace(" ", "")
    return out


def test_pyproject_dependencies_are_the_run_commands_pins():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
        want = _pins(f)
    got = _pins(project["dependencies"])
    assert got.pop("torch").startswith("torch>=")      # the run command names the CPU build itself
    assert got == want
    assert project["scripts"] == {"vegas": "vegas_core.cli:main", "vegas-studio": "vegas_studio_app.ui:main"}


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter started in the repository root (where a user runs app.py)."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT, **env))


def test_hugging_face_kernels_package_is_not_shadowed_from_the_project_root():
    """transformers >= 5.25 imports Hugging Face's `kernels` package; from the project root (where
    `python app.py` and the benchmarks run) it must find theirs, and ours stays vegas_core.kernels."""
    run = _python(
        "import kernels, transformers, vegas_core.kernels.verify_attention as va\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "from transformers.integrations import hub_kernels\n"
        "LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,\n"
        "                 num_attention_heads=2, num_key_value_heads=1, vocab_size=64))\n"
        "print(kernels.__file__, va.__name__)")
    assert run.returncode == 0, run.stderr[-3000:]
    theirs, ours = run.stdout.split()
    assert not theirs.startswith(ROOT) and ours == "vegas_core.kernels.verify_attention"


BLOCK_TRITON = """
import importlib, pkgutil, sys
class NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("Triton is blocked in this test")
sys.meta_path.insert(0, NoTriton())
"""


def test_the_product_imports_and_generates_without_triton():
    """Every module imports and the CPU engine generates with Triton absent (the run command does
    not install it); asking for the Triton path then says what is missing."""
    run = _python(BLOCK_TRITON + """
for pkg in ("vegas_core", "vegas_studio_app", "visualizations"):
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
from vegas_core.cli import main
assert main(["generate", "--prompt", "hi", "--max-tokens", "3", "--method", "vegas", "--json"]) == 0
assert main(["generate", "--prompt", "hi", "--max-tokens", "3", "--attention", "triton"]) == 2
""", TRITON_INTERPRET="1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert '"generated_tokens": 3' in run.stdout
    assert "error: attention='triton' needs the triton package" in run.stderr

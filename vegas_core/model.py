"""Our own eager forward pass for the Llama family (Llama, Mistral, Qwen2 with qkv bias, Qwen3 with
per-head q/k RMSNorm). Plain PyTorch modules named as in Hugging Face checkpoints, so a loaded state
dict fits with `load_state_dict(strict=True)`. Attention goes through a backend (see `attention/`).

Contract: `CausalLM.forward(input_ids [T], positions [T], pool, meta, logit_rows [R] | None,
seq_lens [T] | None)` writes the new tokens' K/V into the pool and returns logits [R, vocab] float32
for the requested rows (all rows when None). Built with `KernelOptions` (the GPU path), the same
maths runs through the Triton kernels of `kernels/fused.py`: fewer launches per layer, same logits;
and forwards of up to `fused_linear_rows` rows run their projections through
`kernels/fused_linear.py` with the norms, SiLU * up and residual adds inside them (the same
roundings around the products, whose own reduction order is Triton's, not cuBLAS's). With
`KernelOptions.deterministic` every forward does, the head included, so a row's logits do not
depend on how many rows its forward has.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from vegas_core.kernels.fused import add_rms_norm, rotary_qkv, silu_mul
from vegas_core.kernels.fused_linear import head_config, linear_add, norm_linear
from vegas_core.kernels.qkv_rotary import norm_linear_rotary

from .attention import AttentionMetadata
from .config import ModelConfig
from .kv_cache import KVPool
from .options import KernelOptions
from .rope import RotaryEmbedding, apply_rotary


class FusedOps:
    """The GPU path's layer kernels with the launch options bound, so the layers call them
    without knowing the options."""

    def __init__(self, options: KernelOptions):
        pdl = options.pdl
        # The batch-invariant mode's product launches (`InvariantConfig.linear`), where it sets any.
        table = options.invariant.linear_table() if options.deterministic else None
        self.add_rms_norm = partial(add_rms_norm, pdl=pdl)
        self.rotary_qkv = partial(rotary_qkv, pdl=pdl)
        self.silu_mul = partial(silu_mul, pdl=pdl)
        self.norm_linear = partial(norm_linear, pdl=pdl, table=table)
        self.linear_add = partial(linear_add, pdl=pdl, table=table)
        self.norm_linear_rotary = partial(norm_linear_rotary, pdl=pdl, table=table)
        self.head_config = options.invariant.head if options.deterministic else None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; same maths as below when nothing is cast
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Normalise in float32 as Hugging Face does, then cast back before the weight multiply.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.cfg = layer, cfg
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        # Llama and Qwen3 put the attention bias on o_proj too; Qwen2 only on q/k/v.
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.attention_bias and cfg.arch != "qwen2")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def fuse(self) -> None:
        """One matmul for q, k and v: the separate weights become views of the fused one, so memory
        is not doubled and the per-call overhead (which dominates small-batch decode) is paid once."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight = _fuse([p.weight for p in projs])
        self.qkv_bias = _fuse([p.bias for p in projs]) if self.cfg.attention_bias else None

    def forward(self, x, cos, sin, backend, pool: KVPool, meta: AttentionMetadata):
        t = x.shape[0]
        c = self.cfg
        hq, hkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q = qkv[:, :hq].view(t, c.num_heads, c.head_dim)
        k = qkv[:, hq:hq + hkv].view(t, c.num_kv_heads, c.head_dim)
        v = qkv[:, hq + hkv:].view(t, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = backend.forward(self.layer, q, k, v, pool, meta)
        return self.o_proj(o.reshape(t, -1))

    def forward_fused(self, x, cos, sin, backend, pool: KVPool, meta: AttentionMetadata, ops: FusedOps):
        """`forward` with one kernel for the rotary and the pool write (`attend_fused`)."""
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        return self.o_proj(self.attend_fused(qkv, cos, sin, backend, pool, meta, ops))

    def attend_fused(self, qkv, cos, sin, backend, pool: KVPool, meta: AttentionMetadata, ops: FusedOps):
        """Attention from the projected qkv [T, (H + 2 KVH) d] to o [T, H d], before o_proj;
        cos/sin [T, head_dim]. The rotary and the pool write are one kernel; Qwen3's per-head
        q/k RMSNorm is fused into it too (before the rotation, with RMSNorm's roundings), so no
        layer falls back to the unfused path. The backend is told (k = v = None) that the K/V are
        in the pool already."""
        c = self.cfg
        norms = (self.q_norm.weight, self.k_norm.weight) if c.qk_norm else (None, None)
        q = ops.rotary_qkv(qkv, cos, sin, c.num_heads, c.num_kv_heads, c.head_dim, pool.k[self.layer],
                       pool.v[self.layer], meta.slot_mapping, *norms, c.rms_norm_eps)
        o = backend.forward(self.layer, q, None, None, pool, meta)
        return o.reshape(qkv.shape[0], -1)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def fuse(self) -> None:
        self.gate_up_weight = _fuse([self.gate_proj.weight, self.up_proj.weight])

    def forward(self, x):
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def forward_fused(self, x, ops: FusedOps):
        return self.down_proj(ops.silu_mul(F.linear(x, self.gate_up_weight)))


def _fuse(params: list[nn.Parameter]) -> torch.Tensor:
    fused = torch.cat([p.data for p in params])
    row = 0
    for p in params:
        n = p.shape[0]
        p.data = fused[row:row + n]
        row += n
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, backend, pool, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend, pool, meta)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(self, delta, residual, cos, sin, backend, pool, meta, ops: FusedOps):
        """The residual stream carried as (delta, residual) with each add done inside the next
        RMSNorm kernel: the stream is `delta + residual` (just `delta`, the embeddings, when
        residual is None). Returns this layer's (mlp output, stream before adding it)."""
        ln_in, ln_post = self.input_layernorm, self.post_attention_layernorm
        h, residual = ops.add_rms_norm(delta, ln_in.weight, ln_in.eps, residual)
        attn = self.self_attn.forward_fused(h, cos, sin, backend, pool, meta, ops)
        h, residual = ops.add_rms_norm(attn, ln_post.weight, ln_post.eps, residual)
        return self.mlp.forward_fused(h, ops), residual

    def forward_fused_linear(self, hidden, cos, sin, backend, pool, meta, ops: FusedOps,
                             rotary_epilogue: bool = True):
        """The layer in five launches besides attention (`kernels/fused_linear.py`): each
        RMSNorm is its projection's prologue, SiLU * up the gate/up product's epilogue, and the
        residual adds the epilogues of o_proj and down_proj, which update `hidden` (the stream)
        in place. With `rotary_epilogue` the rotary and the pool write are the qkv product's
        epilogue (`kernels/qkv_rotary.py`): four launches; only for models without a per-head
        q/k norm (`CausalLM.rotary_in_qkv`). Returns `hidden`."""
        ln_in, ln_post = self.input_layernorm, self.post_attention_layernorm
        attn, mlp = self.self_attn, self.mlp
        c = attn.cfg
        if rotary_epilogue:
            q = ops.norm_linear_rotary(hidden, ln_in.weight, ln_in.eps, attn.qkv_weight,
                                   attn.qkv_bias, cos, sin, c.num_heads, c.num_kv_heads,
                                   c.head_dim, pool.k[attn.layer], pool.v[attn.layer],
                                   meta.slot_mapping)
            o = backend.forward(attn.layer, q, None, None, pool, meta).reshape(hidden.shape[0], -1)
        else:
            qkv = ops.norm_linear(hidden, ln_in.weight, ln_in.eps, attn.qkv_weight, attn.qkv_bias)
            o = attn.attend_fused(qkv, cos, sin, backend, pool, meta, ops)
        ops.linear_add(o, attn.o_proj.weight, hidden, attn.o_proj.bias)
        act = ops.norm_linear(hidden, ln_post.weight, ln_post.eps, mlp.gate_up_weight, silu_mul=True)
        return ops.linear_add(act, mlp.down_proj.weight, hidden)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """`backend`: the attention backend (`attention/`). `kernels`: the GPU path's options; with them
    Triton kernels fuse the residual adds into the RMSNorms, rotary + pool write, and SiLU * up
    (same maths, far fewer launches); None: plain PyTorch ops."""
    backbone_class = Backbone   # gemma.GemmaCausalLM brings its own layers

    def __init__(self, cfg: ModelConfig, backend=None, kernels: KernelOptions | None = None):
        super().__init__()
        self.config = cfg
        self.model = self.backbone_class(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RotaryEmbedding(cfg)
        self.backend = backend
        self.ops = FusedOps(kernels) if kernels is not None else None
        # Decode and draft steps (up to this many rows) also run the projections in Triton with
        # the norms, SiLU * up and residual adds inside; verification and prefill keep cuBLAS's,
        # faster at hundreds of rows.
        self.fused_linear_rows = kernels.fused_linear_rows if kernels is not None else 0
        # Batch-invariant: every forward through the fused projections, the head too.
        self.deterministic = kernels is not None and kernels.deterministic

    def rotary_in_qkv(self) -> bool:
        """Whether decode and draft steps (the fused projections' forwards) run the rotary and the
        pool write inside the qkv product: it needs the fused projections and no per-head q/k norm
        (Qwen3's stays in the rotary kernel)."""
        return bool(self.ops is not None and (self.fused_linear_rows or self.deterministic)
                    and not self.config.qk_norm)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        weights = dict(weights)
        if self.config.tie_word_embeddings or "lm_head.weight" not in weights:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        self.load_state_dict(weights, strict=True)
        self.fuse()

    def fuse(self) -> None:
        """(Re)build the fused projection weights; call again after moving the model."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, pool: KVPool,
                meta: AttentionMetadata, logit_rows: torch.Tensor | None = None,
                seq_lens: torch.Tensor | None = None, float_logits: bool = True) -> torch.Tensor:
        """Logits [rows, vocab]: float32, or with ``float_logits=False`` in the head's own dtype
        (a greedy chain step takes only their argmax, which the cast cannot change)."""
        logits = self._logits(input_ids, positions, pool, meta, logit_rows, seq_lens)
        return logits.float() if float_logits else logits

    def _logits(self, input_ids, positions, pool, meta, logit_rows, seq_lens) -> torch.Tensor:
        cos, sin = self.rope.cos_sin(positions, seq_lens)
        x = self.model.embed_tokens(input_ids)
        # Shaped and cast once for all layers: [T, 1, head_dim] in the activation dtype.
        cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
        if self.ops is not None:
            return self._forward_fused(x, cos[:, 0], sin[:, 0], pool, meta, logit_rows)
        for layer in self.model.layers:
            x = layer(x, cos, sin, self.backend, pool, meta)
        if logit_rows is not None:
            x = x[logit_rows]
        return self.lm_head(self.model.norm(x))

    def _forward_fused(self, x, cos, sin, pool, meta, logit_rows):
        """`forward`'s layers and final norm through `DecoderLayer.forward_fused`; the last
        residual add happens in the final norm, after the logit rows are picked (the add is
        element-wise, so picking first gives the same rows). Up to `fused_linear_rows` rows,
        through `DecoderLayer.forward_fused_linear` instead (the stream then needs no last add;
        the head stays cuBLAS's, faster than the Triton product for a 49K vocabulary, except in
        the batch-invariant mode, where every forward takes this path)."""
        norm, ops = self.model.norm, self.ops
        if x.shape[0] <= self.fused_linear_rows or self.deterministic:
            hidden = x          # the embeddings, a new tensor: updated in place from here on
            rotary_in_qkv = self.rotary_in_qkv()
            for layer in self.model.layers:
                hidden = layer.forward_fused_linear(hidden, cos, sin, self.backend, pool, meta, ops,
                                                    rotary_in_qkv)
            if logit_rows is not None:
                hidden = hidden[logit_rows]
            if self.deterministic:
                return ops.norm_linear(hidden, norm.weight, norm.eps, self.lm_head.weight,
                                       config=head_config(ops.head_config))
            return self.lm_head(ops.add_rms_norm(hidden, norm.weight, norm.eps)[0])
        delta, residual = x, None
        for layer in self.model.layers:
            delta, residual = layer.forward_fused(delta, residual, cos, sin, self.backend, pool, meta, ops)
        if logit_rows is not None:
            delta = delta[logit_rows]
            residual = None if residual is None else residual[logit_rows]
        return self.lm_head(ops.add_rms_norm(delta, norm.weight, norm.eps, residual)[0])

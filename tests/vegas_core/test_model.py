"""Our forward equals Hugging Face transformers' on the same weights (fp32, max abs diff <= 1e-4),
for prefill and for step-by-step decode through the paged cache."""
import pytest
import torch

from vegas_core.block_manager import BlockAllocator
from vegas_core.loader import load_model
from vegas_core.model_runner import BatchEntry, ModelRunner, build_model
from vegas_core.options import EngineOptions, KernelOptions

TOL = 1e-4


def _hf_incremental(hf, prompt, steps):
    """HF logits for the prompt (all rows), then for each of `steps` tokens fed one at a time with
    its KV cache. Returns (prefill [P, V], decode [S, V])."""
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        pre, past = out.logits[0], out.past_key_values
        dec = []
        for i, tok in enumerate(steps):
            out = hf(torch.tensor([[tok]]), past_key_values=past, use_cache=True,
                     position_ids=torch.tensor([[len(prompt) + i]]))
            dec.append(out.logits[0, -1])
            past = out.past_key_values
    return pre, torch.stack(dec)


def _ours(runner, prompts, steps, block_size):
    """Prefill each prompt, then decode `steps` tokens each, one at a time, through block tables that
    interleave in the pool. Each sequence runs in its own forward call: batching rows changes the
    matmul reduction order, which moves 135M-model logits by about 1e-4 in fp32 (the batch tests
    check batching by greedy equality instead)."""
    alloc = BlockAllocator(runner.pool.num_blocks, block_size)
    total = [len(p) + len(s) for p, s in zip(prompts, steps)]
    # Grow the two sequences alternately, page by page, so their block tables interleave.
    for n in range(block_size, max(total) + block_size, block_size):
        for sid, t in enumerate(total):
            alloc.ensure(sid, min(n, t))
    pre = [runner.forward([BatchEntry(i, p, 0, logits="all")], alloc) for i, p in enumerate(prompts)]
    dec = [[] for _ in prompts]
    for j in range(len(steps[0])):
        for i, (p, s) in enumerate(zip(prompts, steps)):
            dec[i].append(runner.forward([BatchEntry(i, [s[j]], len(p) + j, logits="last")], alloc)[0])
    return pre, [torch.stack(d) for d in dec]


def _compare(runner, hf, vocab, block_size=4, seed=0, tol=TOL):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (11, 6)]
    steps = [torch.randint(0, vocab, (9,), generator=g).tolist() for _ in prompts]
    pre, dec = _ours(runner, prompts, steps, block_size)
    for i, p in enumerate(prompts):
        hf_pre, hf_dec = _hf_incremental(hf, p, steps[i])
        assert (pre[i] - hf_pre).abs().max() <= tol
        assert (dec[i] - hf_dec).abs().max() <= tol


CASES = {
    "llama": ("llama", {}),
    "llama-bias": ("llama", dict(attention_bias=True)),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", dict(head_dim=32)),
    "llama-tied": ("llama", dict(tie_word_embeddings=True)),
    "rope-linear": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    # max_position_embeddings below the sequence length, so the dynamic base really changes
    "rope-dynamic": ("llama", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                                   max_position_embeddings=8)),
    "rope-yarn": ("qwen2", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64})),
    "rope-llama3": ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tiny_models_match_transformers(tmp_path, make_tiny_hf_model, case):
    arch, overrides = CASES[case]
    path, hf = make_tiny_hf_model(tmp_path / case, arch, **overrides)
    loaded = load_model(path)
    runner = ModelRunner(loaded.config, loaded.weights, torch.device("cpu"), torch.float32,
                         num_blocks=32, options=EngineOptions(block_size=4))
    _compare(runner, hf, loaded.config.vocab_size)


def test_smollm2_gguf_matches_transformers(default_model):
    """The embedded model: our loader's weights (equal to transformers' GGUF loader's, see the loader
    tests) in transformers' LlamaForCausalLM against our forward, both in float64, to 1e-5.

    Why float64: over 30 layers, float32 rounding in the two forwards' different (equally valid)
    operation orders moves a decode logit by up to about 1.1e-4, and how far depends on the CPU
    thread count (1 thread: 1.1e-4, 2 threads: 6e-5), so a float32 bound here tests the machine.
    In float64 the two agree to the float32 rounding of our logits (the engine returns float32
    logits; rotary tables are float32 in both, as in transformers): measured 1.9e-6, one float32
    ulp of a logit near 16. The bound is ten times tighter than the float32 one."""
    from transformers import LlamaConfig, LlamaForCausalLM
    c = default_model.config
    hf_cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                         num_key_value_heads=c.num_kv_heads, max_position_embeddings=c.max_position_embeddings,
                         rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, tie_word_embeddings=True)
    hf = LlamaForCausalLM(hf_cfg).eval()
    hf.load_state_dict(default_model.weights, strict=False)
    hf.tie_weights()
    hf.to(torch.float64)
    runner = ModelRunner(c, default_model.weights, torch.device("cpu"), torch.float64, num_blocks=16)
    _compare(runner, hf, c.vocab_size, block_size=16, tol=1e-5)


FUSED_CASES = [(case, attention, linear) for case in ("llama", "qwen3")
               for attention in ("reference", "triton") for linear in ("cublas", "fused-linear")]
FUSED_CASES += [("qwen2", "reference", "fused-linear"), ("llama-bias", "reference", "fused-linear")]


@pytest.mark.parametrize("case, attention, linear", FUSED_CASES)
def test_fused_ops_match_unfused(tmp_path, make_tiny_hf_model, case, attention, linear):
    """The model built with `KernelOptions` (the Triton kernels of kernels/fused.py, here under the interpreter:
    residual adds inside the RMSNorms, q/k norm + rotary + pool write in one kernel, SiLU * up)
    gives the unfused path's logits and KV pool within 1e-5 in fp32: prefill, then decode steps
    through the paged cache, with either attention backend reading the K/V the kernel wrote.
    "fused-linear" runs every forward through kernels/fused_linear.py (norms, SiLU * up and the
    residual adds inside the projections, qkv and o_proj biases included: Qwen2's, Llama's;
    the rotary and pool write as the qkv product's epilogue, kernels/qkv_rotary.py, but for
    Qwen3, whose q/k norm keeps the rotary kernel); "cublas" none (`fused_linear_rows` 0,
    prefill's path). With attention "reference" the fused layer kernels run beside the reference
    attention backend."""
    arch, overrides = CASES[case]
    path, _ = make_tiny_hf_model(tmp_path / case, arch, **overrides)
    loaded = load_model(path)
    g = torch.Generator().manual_seed(1)
    vocab = loaded.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (11, 6)]
    steps = [torch.randint(0, vocab, (3,), generator=g).tolist() for _ in prompts]
    results = {}
    for fused in (False, True):
        runner = ModelRunner(loaded.config, loaded.weights, torch.device("cpu"), torch.float32,
                             num_blocks=32, options=EngineOptions(block_size=4, attention=attention))
        kernels = KernelOptions(fused_linear_rows=1 << 20 if linear == "fused-linear" else 0) if fused else None
        runner.model = build_model(loaded.config, loaded.weights, runner.device, runner.dtype,
                                   runner.model.backend, kernels)
        results[fused] = (*_ours(runner, prompts, steps, block_size=4), runner.pool)
    (pre, dec, pool), (pre_f, dec_f, pool_f) = results[False], results[True]
    for i in range(len(prompts)):
        assert (pre_f[i] - pre[i]).abs().max() <= 1e-5
        assert (dec_f[i] - dec[i]).abs().max() <= 1e-5
    for layer in range(loaded.config.num_layers):
        assert (pool_f.k[layer] - pool.k[layer]).abs().max() <= 1e-5
        assert (pool_f.v[layer] - pool.v[layer]).abs().max() <= 1e-5


GEMMA3_CASES = {
    "gemma3": {},
    "gemma3-softcap": dict(final_logit_softcapping=3.0),
    "gemma3-pattern": dict(layer_types=None, sliding_window_pattern=2, rope_parameters=None),
}


@pytest.mark.parametrize("case", sorted(GEMMA3_CASES))
def test_tiny_gemma3_matches_transformers(tmp_path, make_tiny_hf_model, case):
    """Gemma 3's layer (four (1 + w) norms, GeGLU, q/k norms, embedding scale) with sliding and
    global layers, local and global RoPE bases: prefill and paged decode past the window of 5."""
    from tests.vegas_core.conftest import TINY_GEMMA3
    path, hf = make_tiny_hf_model(tmp_path / case, "gemma3", **{**TINY_GEMMA3, **GEMMA3_CASES[case]})
    loaded = load_model(path)
    assert loaded.config.arch == "gemma3" and loaded.config.sliding_window == 5
    assert loaded.config.layer_types == tuple(hf.config.layer_types)
    runner = ModelRunner(loaded.config, loaded.weights, torch.device("cpu"), torch.float32,
                         num_blocks=32, options=EngineOptions(block_size=4))
    _compare(runner, hf, loaded.config.vocab_size)


def _last_rows(runner, prompt, steps, block_size=16):
    """Our logits of the prompt's last row, then of each step decoded through the paged cache,
    the request's pages interleaved with another's in the pool."""
    alloc = BlockAllocator(runner.pool.num_blocks, block_size)
    for n in range(block_size, len(prompt) + len(steps) + block_size, block_size):
        alloc.ensure(0, min(n, len(prompt) + len(steps)))
        alloc.ensure(1, n)
    rows = [runner.forward([BatchEntry(0, prompt, 0, logits="last")], alloc)[0]]
    for j, tok in enumerate(steps):
        rows.append(runner.forward([BatchEntry(0, [tok], len(prompt) + j, logits="last")], alloc)[0])
    return torch.stack(rows)


def _hf_last_rows(hf, prompt, steps):
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        rows, cache = [out.logits[0, -1]], out.past_key_values
        for j, tok in enumerate(steps):
            out = hf(torch.tensor([[tok]]), past_key_values=cache, use_cache=True,
                     position_ids=torch.tensor([[len(prompt) + j]]))
            rows.append(out.logits[0, -1])
            cache = out.past_key_values
    return torch.stack(rows)


def _packaged_model_diff(loaded, prompt_len: int) -> float:
    from tests.vegas_core.conftest import hf_twin
    c = loaded.config
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, c.vocab_size, (prompt_len,), generator=g).tolist()
    steps = torch.randint(0, c.vocab_size, (3,), generator=g).tolist()
    blocks = 2 * (-(-(prompt_len + len(steps)) // 16)) + 2
    runner = ModelRunner(c, loaded.weights, torch.device("cpu"), torch.float32, num_blocks=blocks, options=EngineOptions(block_size=16))
    ours = _last_rows(runner, prompt, steps)
    del runner
    theirs = _hf_last_rows(hf_twin(loaded, torch.float32), prompt, steps)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    return float((ours - theirs).abs().max())


def test_gemma3_gguf_matches_transformers(gemma_model, one_thread):
    """The real Gemma-3-270M (our loader's weights; they equal transformers' GGUF loader's) against
    transformers' Gemma3ForCausalLM in fp32 to 1e-4: a 516-token prompt, so the sliding layers'
    window of 512 is full and has moved on, then three paged decode steps. Measured (one thread):
    prefill 0.0, decode 4.0e-5."""
    assert _packaged_model_diff(gemma_model, 516) <= TOL


def test_qwen25_coder_gguf_matches_transformers(qwen_model, one_thread):
    """The real Qwen2.5-Coder-0.5B against transformers' Qwen2ForCausalLM in fp32: an 11-token
    prompt and three paged decode steps. The bound is 1e-3, not 1e-4: the prefill rows agree
    exactly, a decode step by 2.9e-4 (one thread; logits up to 16), float32 rounding in the two
    decode attentions' different (equally valid) orders, which Qwen2.5's large activations
    magnify over 24 layers (the Qwen2 forward itself matches to 1e-4 on tiny checkpoints above)."""
    assert _packaged_model_diff(qwen_model, 11) <= 1e-3


def test_tiny_gemma3_batched_decode_matches_transformers(tmp_path, make_tiny_hf_model):
    """Two requests decoded in one forward a step (the reference backend's padded decode batch):
    one shorter than the window of 8 for its first steps, one past it, each sliding layer
    gathering only its rows' windows."""
    from tests.vegas_core.conftest import TINY_GEMMA3
    path, hf = make_tiny_hf_model(tmp_path / "gemma3", "gemma3", **{**TINY_GEMMA3, "sliding_window": 8})
    loaded = load_model(path)
    runner = ModelRunner(loaded.config, loaded.weights, torch.device("cpu"), torch.float32,
                         num_blocks=32, options=EngineOptions(block_size=4))
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 262, (n,), generator=g).tolist() for n in (3, 11)]
    steps = [torch.randint(0, 262, (9,), generator=g).tolist() for _ in prompts]
    alloc = BlockAllocator(32, 4)
    for i, (p, s) in enumerate(zip(prompts, steps)):
        alloc.ensure(i, len(p) + len(s))
        runner.forward([BatchEntry(i, p, 0, logits="last")], alloc)
    rows = [runner.forward([BatchEntry(i, [s[j]], len(p) + j, logits="last")
                            for i, (p, s) in enumerate(zip(prompts, steps))], alloc) for j in range(9)]
    for i, (p, s) in enumerate(zip(prompts, steps)):
        _, hf_dec = _hf_incremental(hf, p, s)
        assert (torch.stack([r[i] for r in rows]) - hf_dec).abs().max() <= TOL

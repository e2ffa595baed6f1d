"""A SentencePiece-BPE vocabulary stored in a GGUF file (`tokenizer.ggml.model == "llama"`, as
Gemma 3's) rebuilt as a `tokenizers` BPE with byte fallback, the shape transformers' `GemmaTokenizer`
gives the same file (its GGUF builder: `integrations/gguf/gguf_tokenizer_mapping.py`), so both
tokenize alike. The file stores no merges: they are recovered from the vocabulary, every split of
a token into two tokens, ranked by the token's position in the file (Gemma's scores do not follow
its merge order; the file order does). Contract: `sentencepiece_backend(metadata) -> Tokenizer`.
"""
from __future__ import annotations

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

_CONTROL, _USER_DEFINED = 3, 4
_SPACE = "\u2581"


def sentencepiece_backend(metadata: dict) -> BackendTokenizer:
    tokens = list(metadata["tokenizer.ggml.tokens"])
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    # A token of spaces only is stored with real spaces; the normalizer turns text spaces into ▁.
    spelled = [_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=_merges(spelled, vocab), unk_token=unk,
                                          fuse_unk=True, byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", _SPACE)
    # GemmaTokenizer's own pre-tokenizer; after the normalizer no " " is left, so it never splits.
    backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    backend.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, k in zip(tokens, types) if k == _CONTROL])
    user = [AddedToken(t, normalized=False, special=False) for t, s, k in zip(tokens, spelled, types)
            if k == _USER_DEFINED and t == s]
    if user:
        backend.add_tokens(user)
    return backend


def _merges(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every (left, right) split of a token into two vocabulary tokens, ranked by the merged
    token's file position, then by the left and right lengths (transformers' `generate_merges`
    with the position as score); within one token, by the pieces' ids."""
    merges = []
    for index, token in enumerate(tokens):
        local = [(token[:i], token[i:]) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges.extend((index, len(l), len(r), l, r) for l, r in local)
    merges.sort(key=lambda m: (m[0], -m[1], -m[2]))
    return [(l, r) for _, _, _, l, r in merges]

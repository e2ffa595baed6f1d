"""Text <-> token ids, chat templates and streaming detokenization.

Contract: `Tokenizer` wraps a `tokenizers.Tokenizer` (the Rust fast tokenizer) built either from a
GGUF file's metadata (`from_gguf_metadata`) or from a Hugging Face directory (`from_hf_dir`); it
never imports transformers. `apply_chat_template` renders the model's own Jinja template in a
sandbox with time and size limits (`chat_template`). `IncrementalDecoder` turns a growing list of
generated ids into text deltas whose concatenation (plus `flush()`) equals `decode(ids)`, never
emitting half of a UTF-8 character.
The engine itself knows nothing about tokenization: it only sees ids.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from functools import lru_cache

import jinja2
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from .chat_template import ChatTemplate, compile_chat_template
from .errors import InvalidRequestError, ModelLoadError

# llama.cpp token types (tokenizer.ggml.token_type)
_CONTROL, _USER_DEFINED = 3, 4

# Tokens that end an assistant turn. When one of them appears in the chat template it is a stop
# token for chat generation even if the file names another as its eos (Qwen files name
# <|endoftext|> while the template closes turns with <|im_end|>).
_TURN_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _byte_level_pre_tokenizer(pre: str | None):
    """The split llama.cpp applies for `tokenizer.ggml.pre`, as a `tokenizers` pre-tokenizer.

    "smollm" (and the StarCoder family) is llama.cpp's `\\p{N}` split followed by the GPT-2 regex,
    which is exactly SmolLM2's own tokenizer.json: Digits(individual) + ByteLevel. transformers'
    GGUF converter has no entry for "smollm" and falls back to plain GPT-2, which differs only on
    whitespace runs directly before a digit ("a  1": we give "ĠĠ","1", it gives "Ġ","Ġ","1").
    """
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
             "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}.get(pre or "", None)
    if split is None:  # "gpt2", "default" and anything we do not know: GPT-2's own regex
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


class Tokenizer:
    """A fast tokenizer plus what generation needs around it: special ids and the chat template."""

    def __init__(self, backend: BackendTokenizer, *, chat_template: str | None = None,
                 bos_token: str | None = None, eos_token: str | None = None,
                 eos_token_ids: Iterable[int] = (), add_bos_token: bool = False):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos_token = add_bos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        ids = list(eos_token_ids)
        if eos_token and backend.token_to_id(eos_token) is not None:
            ids.append(backend.token_to_id(eos_token))
        for token in _TURN_END_TOKENS:
            if chat_template and token in chat_template and backend.token_to_id(token) is not None:
                ids.append(backend.token_to_id(token))
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))  # ordered, no duplicates
        # compiled now, so a template that does not parse fails the load, not the first request
        self._template = _compile_template(chat_template) if chat_template else None

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> "Tokenizer":
        """Build from llama.cpp keys (`tokenizer.ggml.*`): byte-level BPE ("gpt2") or Gemma's
        SentencePiece BPE ("llama" in a gemma* file; `sentencepiece_gguf.py`)."""
        kind = metadata.get("tokenizer.ggml.model")
        if kind == "llama" and str(metadata.get("general.architecture", "")).startswith("gemma"):
            # Gemma's conventions (merge order = file order, spaces stored raw); other
            # SentencePiece files rank merges by score and are not supported yet
            from .sentencepiece_gguf import sentencepiece_backend
            return cls._with_gguf_specials(sentencepiece_backend(metadata), metadata)
        if kind != "gpt2":
            raise ModelLoadError(f"GGUF tokenizer.ggml.model {kind!r} is not supported; supported: 'gpt2' "
                                 "(byte-level BPE) and 'llama' (SentencePiece BPE) of Gemma files")
        tokens: list[str] = metadata["tokenizer.ggml.tokens"]
        types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        alphabet = set(bytes_to_unicode().values())
        spell = bytes_to_unicode()
        # A token written with characters outside the byte alphabet (a raw space, say) is re-spelled
        # in it, as transformers does, so BPE can reach it.
        vocab = {(t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))): i
                 for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
        try:
            backend = BackendTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        except Exception as exc:  # tokenizers raises a plain Exception, e.g. for a merge of unknown tokens
            raise ModelLoadError(f"cannot build the tokenizer from GGUF metadata: {exc}") from None
        backend.pre_tokenizer = _byte_level_pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
        backend.decoder = decoders.ByteLevel()
        # Control tokens (<|im_start|>...) must match whole and be skippable on decode; user-defined
        # ones match whole but are ordinary text. A "control" token outside the byte alphabet is a
        # llama.cpp mislabel (transformers skips those too).
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
                                    if k == _CONTROL and set(t) <= alphabet])
        user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types)
                if k == _USER_DEFINED and t in vocab]  # re-spelled ones would get new ids past the model
        if user:
            backend.add_tokens(user)
        return cls._with_gguf_specials(backend, metadata)

    @classmethod
    def _with_gguf_specials(cls, backend: BackendTokenizer, metadata: dict) -> "Tokenizer":
        """BOS (prepended when the file says so), EOS and the chat template from the file."""
        tokens: list[str] = metadata["tokenizer.ggml.tokens"]

        def token(key):
            i = metadata.get(f"tokenizer.ggml.{key}")
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

        bos, add_bos = token("bos_token_id"), bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        if add_bos and bos and backend.token_to_id(bos) is not None:
            backend.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, backend.token_to_id(bos))])
        return cls(backend, chat_template=metadata.get("tokenizer.chat_template"), bos_token=bos,
                   eos_token=token("eos_token_id"), add_bos_token=add_bos)

    @classmethod
    def from_hf_dir(cls, path: str, eos_token_ids: Iterable[int] = ()) -> "Tokenizer":
        """Build from `tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`)."""
        tok_file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tok_file):
            raise ModelLoadError(f"{path} has no tokenizer.json (only fast tokenizers are supported)")
        try:
            backend = BackendTokenizer.from_file(tok_file)
            cfg = _read_json(os.path.join(path, "tokenizer_config.json")) or {}
            template = cfg.get("chat_template")
            if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
                template = named.get("default") or next(iter(named.values()), None)
            if not isinstance(template, str):
                template = None
            jinja_file = os.path.join(path, "chat_template.jinja")
            if os.path.isfile(jinja_file):  # transformers >= 4.50 saves the template here instead
                with open(jinja_file, encoding="utf-8") as f:
                    template = f.read()
        except Exception as exc:  # tokenizers raises a plain Exception on a malformed file
            raise ModelLoadError(f"cannot read the tokenizer in {path}: {exc}") from None
        return cls(backend, chat_template=template, bos_token=_token_content(cfg.get("bos_token")),
                   eos_token=_token_content(cfg.get("eos_token")), eos_token_ids=eos_token_ids,
                   add_bos_token=bool(cfg.get("add_bos_token", False)))

    def save_pretrained(self, path: str) -> None:
        """Write tokenizer.json + tokenizer_config.json, readable by `from_hf_dir` and transformers."""
        os.makedirs(path, exist_ok=True)
        self.backend.save(os.path.join(path, "tokenizer.json"))
        config = {"bos_token": self.bos_token, "eos_token": self.eos_token, "add_bos_token": self.add_bos_token,
                  "chat_template": self.chat_template, "tokenizer_class": "PreTrainedTokenizerFast"}
        with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)

    # --- text <-> ids -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of `text`. Special tokens written in the text (<|im_start|>) are always recognised;
        `add_special_tokens` only adds the BOS the tokenizer is configured to prepend."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def incremental_decoder(self, skip_special_tokens: bool = True) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special_tokens)

    # --- chat ---------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """Render `messages` with the model's template. Extra keyword arguments (tools,
        enable_thinking...) are passed to the template as variables."""
        if self._template is None:
            raise InvalidRequestError("this model has no chat template; send a plain prompt instead")
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                         **kwargs)
        except Exception as exc:  # noqa: BLE001 -- the template is the model's code: any failure is its own
            # raise_exception() in the template, messages of the wrong shape (content None...), or a limit
            raise InvalidRequestError(f"chat template refused the conversation: {exc}") from None


class IncrementalDecoder:
    """Streaming detokenizer: `step(ids)` with the full list of generated ids so far (a list that
    only grows) returns the text the new ids add. Only a short window (`prefix_offset:`) is
    re-decoded each step, and text is held back while it ends in U+FFFD, i.e. while the last
    token ended mid-character. Decoding the window with and without the new ids and emitting the
    difference also keeps sentencepiece's leading-space handling right."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the window re-decoded for context
        self._read_offset = 0    # ids before this have been emitted as text

    def step(self, ids: list[int]) -> str:
        self._ids = list(ids)
        prefix_text, new_text = self._window_texts()
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end, as U+FFFD)."""
        prefix_text, new_text = self._window_texts()
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text):]

    def _window_texts(self) -> tuple[str, str]:
        """The window decoded without and with the ids not yet emitted."""
        window = self._ids[self._prefix_offset:]
        emitted = self._read_offset - self._prefix_offset
        return self._tok.decode(window[:emitted], self._skip), self._tok.decode(window, self._skip)


def _compile_template(source: str) -> ChatTemplate:
    try:
        return compile_chat_template(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ModelLoadError(f"the model's chat template does not parse: {exc}") from exc


def _token_content(token) -> str | None:
    """tokenizer_config.json spells special tokens as a string or as an AddedToken dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{os.path.basename(path)} does not hold a JSON object")
    return data

"""Tokenizer: the default model's GGUF tokenizer against transformers' (encode, decode, chat
template), the HF-directory path, and the streaming detokenizer."""
from __future__ import annotations

import os

import pytest

from vegas_core.errors import InvalidRequestError, ModelLoadError
from vegas_core.loader import default_model_path
from vegas_core.loader.gguf_loader import _open, read_gguf_header
from vegas_core.tokenizer import Tokenizer

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. I'm sure they'll've seen it.",
    "def square(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "héllo wörld — naïve café, Ελληνικά, русский",
    "emoji 😀👍🏽🇫🇷 and CJK 你好，世界。日本語のテキスト",
    "   leading, trailing and    inner   runs   ",
    "tabs\t\tand\nnewlines\r\n\n\n end",
    "year 2024, pi=3.14159, x1 = 42",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]
CONVERSATION = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2+2? Answer with emoji 🤔."}]


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    metadata, _ = read_gguf_header(_open(default_model_path()))
    return Tokenizer.from_gguf_metadata(metadata)


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer

    folder, name = os.path.split(default_model_path())
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(ours, reference, text):
    assert ours.encode(text) == reference.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips_and_matches_transformers(ours, reference, text):
    ids = ours.encode(text)
    assert ours.decode(ids, skip_special_tokens=False) == text == reference.decode(ids)
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_digits_split_like_llama_cpp_smollm(ours, reference):
    """tokenizer.ggml.pre == "smollm": llama.cpp (and SmolLM2's own tokenizer.json) isolate every
    digit before the GPT-2 split. transformers' GGUF converter does not know "smollm" and uses plain
    GPT-2, so a whitespace run right before a digit is the one place where we deliberately differ."""
    tokens = [ours.id_to_token(i) for i in ours.encode("x  12")]
    assert tokens == ["x", "ĠĠ", "1", "2"]
    assert [reference.convert_ids_to_tokens(i) for i in reference.encode("x  12")] == ["x", "Ġ", "Ġ", "1", "2"]


def test_special_ids_and_sizes(ours, reference):
    assert ours.vocab_size == len(reference) == 49152
    assert ours.bos_token_id == reference.bos_token_id == 1
    assert ours.eos_token_ids == (reference.eos_token_id,) == (2,)  # <|im_end|>
    assert ours.encode("hi", add_special_tokens=True) == reference.encode("hi")  # the file says add_bos = false
    assert ours.encode("<|im_start|>") == [1]  # control tokens match whole
    ids = [1, *ours.encode("hi"), 2]
    assert ours.decode(ids) == "hi" and ours.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<|im_end|>"


@pytest.mark.parametrize("messages,add_generation_prompt", [
    (CONVERSATION, True),
    (CONVERSATION, False),
    (CONVERSATION[1:], True),  # no system message: the template inserts SmolLM's default one
])
def test_chat_template_matches_transformers(ours, reference, messages, add_generation_prompt):
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


def test_chat_template_errors_are_request_errors(ours):
    strict = Tokenizer(ours.backend, chat_template="{{ raise_exception('only user turns') }}")
    with pytest.raises(InvalidRequestError, match="only user turns"):
        strict.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(InvalidRequestError, match="no chat template"):
        Tokenizer(ours.backend).apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(InvalidRequestError, match="refused"):  # str + None inside the template
        ours.apply_chat_template([{"role": "user", "content": None}])
    with pytest.raises(ModelLoadError, match="does not parse"):  # a broken template fails the load
        Tokenizer(ours.backend, chat_template="{% for m in messages %}")


@pytest.mark.parametrize("text", ["emoji 😀👍🏽🇫🇷 then 你好，世界。日本語 ok", "Ελληνικά and Ğ 🤔🤔"])
def test_incremental_decoder_never_splits_a_character(ours, text):
    ids = ours.encode(text)
    decoder = ours.incremental_decoder()
    deltas = [decoder.step(ids[:n]) for n in range(1, len(ids) + 1)]
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # at least one multi-token character was held back
    assert "".join(deltas) + decoder.flush() == text


def test_incremental_decoder_flushes_an_incomplete_tail(ours):
    ids = ours.encode("a😀")[:-1]  # generation stopped before the emoji's last byte
    decoder = ours.incremental_decoder()
    assert [decoder.step(ids[:n]) for n in range(1, len(ids) + 1)] == ["a"] + [""] * (len(ids) - 1)
    assert decoder.flush() == ours.decode(ids)[1:] == "\ufffd"


def test_hf_directory_path_matches_transformers(tmp_path, reference):
    """transformers' converted tokenizer saved as a HF directory (tokenizer.json + chat_template.jinja)
    reads back through `from_hf_dir` identically, digits included since it is their pre-tokenizer."""
    reference.save_pretrained(str(tmp_path))
    hf = Tokenizer.from_hf_dir(str(tmp_path))
    for text in TEXTS + ["x  12"]:
        assert hf.encode(text) == reference.encode(text, add_special_tokens=False)
    assert hf.apply_chat_template(CONVERSATION) == reference.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert (hf.bos_token_id, hf.eos_token_ids) == (1, (2,))


def test_save_pretrained_round_trip(tmp_path, ours):
    ours.save_pretrained(str(tmp_path))
    again = Tokenizer.from_hf_dir(str(tmp_path))
    for text in TEXTS + ["x  12"]:
        assert again.encode(text) == ours.encode(text)
    assert again.apply_chat_template(CONVERSATION) == ours.apply_chat_template(CONVERSATION)
    assert (again.bos_token_id, again.eos_token_ids, again.vocab_size) == (1, (2,), 49152)


def test_sentencepiece_gguf_is_gemmas_only():
    """A SentencePiece vocabulary is rebuilt with Gemma's conventions, so a file of another
    architecture is refused rather than tokenized with the wrong merge order."""
    import pytest

    from vegas_core.errors import ModelLoadError
    from vegas_core.tokenizer import Tokenizer
    metadata = {"general.architecture": "llama", "tokenizer.ggml.model": "llama",
                "tokenizer.ggml.tokens": ["<unk>", "a"], "tokenizer.ggml.scores": [0.0, 0.0]}
    with pytest.raises(ModelLoadError, match="'llama' is not supported"):
        Tokenizer.from_gguf_metadata(metadata)
    tiny = Tokenizer.from_gguf_metadata({**metadata, "general.architecture": "gemma3",
                                         "tokenizer.ggml.tokens": ["<unk>", "<bos>", "a", "b", "ab", " ", "▁a"],
                                         "tokenizer.ggml.token_type": [2, 3, 1, 1, 1, 1, 1],
                                         "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.add_bos_token": True})
    assert tiny.encode("ab a", add_special_tokens=True) == [1, 4, 6]
    assert tiny.decode([4, 6]) == "ab a"

"""Deterministic real text for benchmarks: the source code of Python's own standard library.

Nothing is downloaded and nothing is generated: `long_text` tokenizes the sources of a fixed list of
standard-library modules, in order, and cuts (or tiles) the token stream to an exact length. The
text is the same on every machine running the same Python version (`corpus_info()` names the
modules and the version, and the benchmarks write it into their results).
"""
from __future__ import annotations

import importlib
import inspect
import platform
import weakref

# Prose-heavy modules first (long docstrings), then larger code-heavy ones.
MODULES = ("textwrap", "argparse", "string", "difflib", "calendar", "fractions", "shlex", "heapq",
           "dataclasses", "functools", "inspect", "typing", "pathlib", "email.message", "http.client")

_SHORT_PROMPTS = (
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a haiku about the sea.",
    "Give three tips for staying focused while studying.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet.",
    "How does a bicycle stay upright?",
    "Name five fruits that are rich in vitamin C.",
    "Why is the sky blue?",
    "Describe a good morning routine.",
    "What are the main causes of inflation?",
    "Translate 'good night' into Spanish and French.",
    "Write a short thank-you note to a teacher.",
    "How do vaccines work?",
    "What should I pack for a weekend hiking trip?",
    "Explain what a prime number is to a child.",
)

# tokenizer -> (ids so far, modules encoded); weak, so a new tokenizer never finds a dead one's entry
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def module_text(name: str) -> str:
    """One corpus part: a comment line naming the file, then the module's source."""
    module = importlib.import_module(name)
    return f"# ---- Lib/{name.replace('.', '/')}.py ----\n{inspect.getsource(module)}\n"


def corpus_text() -> str:
    return "".join(module_text(name) for name in MODULES)


def corpus_info() -> dict:
    return {"source": "Python standard library sources (inspect.getsource)", "modules": list(MODULES),
            "python": platform.python_version()}


def corpus_ids(tokenizer, at_least: int | None = None) -> list[int]:
    """Token ids of the corpus: each module's part tokenized alone, in order. Parts are encoded
    lazily, only as far as `at_least` tokens need (None: the whole corpus)."""
    ids, done = _cache.get(tokenizer, ([], 0))
    while done < len(MODULES) and (at_least is None or len(ids) < at_least):
        ids = ids + tokenizer.encode(module_text(MODULES[done]))
        done += 1
    _cache[tokenizer] = (ids, done)
    return ids


def long_text(num_tokens: int, tokenizer, offset: int = 0) -> list[int]:
    """Exactly `num_tokens` token ids of real text, starting `offset` tokens into the corpus.

    The corpus is tiled when it is shorter than `offset + num_tokens` (it holds about 200K tokens
    with the SmolLM2 tokenizer), so any length works; distinct offsets give distinct prompts."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    ids = corpus_ids(tokenizer, offset + num_tokens)
    if len(ids) < offset + num_tokens:
        ids = corpus_ids(tokenizer)  # the whole corpus, to tile
    start = offset % len(ids)
    out: list[int] = []
    while len(out) < num_tokens:
        out.extend(ids[start: start + num_tokens - len(out)])
        start = 0
    return out


def short_prompts(n: int) -> list[str]:
    """`n` distinct short English prompts (the hand-written list, then variants of it)."""
    out = []
    for i in range(n):
        base = _SHORT_PROMPTS[i % len(_SHORT_PROMPTS)]
        rnd = i // len(_SHORT_PROMPTS)
        out.append(base if rnd == 0 else f"{base} Keep it under {20 * rnd} words.")
    return out

"""Triton's interpreter, without one redundant cost: re-patching `triton.language` on every call of a
nested @triton.jit helper.

Why: Triton 3.6's interpreter swaps `triton.language`'s functions for interpreted ones when a kernel
starts (`GridExecutor.__call__` -> `_patch_lang`) and puts them back when it ends. It does the same
swap again at every call of a helper the kernel calls (`InterpretedFunction.__call__`), about 2 ms
of attribute setting each time, and never undoes those inner swaps: they set what the kernel's swap
already set. Helpers called inside tile loops made this about a fifth of the kernel-path engine
tests' time (cProfile of tests/vegas_core/test_kernel_backend.py: 15,330 calls, 32 of 160 s).

What changes: while a kernel runs, a helper whose `triton.language` modules were already swapped
since the kernel started skips the swap; anything else (a kernel's own swap, the first helper to
see another module, a Triton without these functions) goes through Triton's code unchanged. What a kernel computes does
not change: the same interpreted functions are in place either way. Tests only (the engine runs
its kernels compiled on a GPU, its references on a CPU).
"""
from __future__ import annotations

import inspect


class _NothingToRestore:
    def restore(self) -> None:
        pass


def install() -> bool:
    """Install the shortcut; False (and nothing changed) where this Triton's interpreter is not
    the one described above."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or executor is None or getattr(patch_lang, "_vegas_shortcut", False):
        return False
    active: list[set[int]] = []    # per running kernel: the modules swapped since it started

    def langs(fn) -> set[int]:
        return {id(v) for v in fn.__globals__.values()
                if inspect.ismodule(v) and v in (tl, tl.core)}

    def shortcut_patch_lang(fn):
        needed = langs(fn)
        if active and active[-1] and needed <= active[-1]:   # a helper: swapped already
            return _NothingToRestore()
        scope = patch_lang(fn)
        if active:        # the kernel's own swap, or a helper's (tl.sum's module: tl.core)
            active[-1] |= needed
        return scope

    shortcut_patch_lang._vegas_shortcut = True
    run_kernel = executor.__call__

    def call(self, *args, **kwargs):
        active.append(set())
        try:
            return run_kernel(self, *args, **kwargs)
        finally:
            active.pop()

    interpreter._patch_lang = shortcut_patch_lang
    executor.__call__ = call
    return True

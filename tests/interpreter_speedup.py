"""Triton's interpreter, without redundant costs (three shortcuts, each installed by its function).

First (`install`): re-patching `triton.language` on every call of a nested @triton.jit helper.

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


def install_shape_cache() -> bool:
    """Second shortcut: `triton.language`'s type objects without rebuilding the same shapes.

    Why: every value the interpreter makes is a `tl.tensor` whose `__init__` turns its shape into a
    `tl.tuple` of `constexpr`s; every block type does the same with its shape, and every `tl.tuple`
    builds a `tuple_type` with a display name formatted from each element's type. A kernel program
    makes thousands of values of a handful of shapes, so this is mostly the same few objects built
    again: in a cProfile of the kernel-path engine test (tests/vegas_core/test_kernel_backend.py)
    `tl.tuple.__init__` ran 9.2 million times, 177 of 780 s.

    What changes: a tensor's and a block type's shape objects (and the block type's element count
    and name) come from a cache keyed by the shape's integers; `tuple_type.name` is formatted when
    read, not when built. The cached shape tuples are shared between values and never mutated
    (shapes are read, not assigned, in kernels; `tl.tuple` has no `__setitem__`). Shapes that are
    not plain integers, and a shape seen for the first time, go through Triton's own code. What a
    kernel computes does not change. False (and nothing changed) where this Triton's classes are
    not the ones described."""
    try:
        from triton.language import core
    except ImportError:
        return False
    tensor_init = core.tensor.__init__
    block_init = core.block_type.__init__
    if getattr(tensor_init, "_vegas_shortcut", False):
        return False
    if not all(hasattr(core, n) for n in ("tuple", "tuple_type", "constexpr", "block_type")) or \
            "name" in vars(core.tuple_type):
        return False

    tensor_shapes: dict = {}   # shape ints -> (tl.tuple of constexpr, constexpr numel)
    block_shapes: dict = {}    # shape ints -> (tl.tuple of ints, numel, str of that tuple)

    def ints(shape):
        key = tuple(shape.values if type(shape) is core.tuple else shape)
        if all(type(v) is int for v in key):
            return key
        key = tuple(v.value if isinstance(v, core.constexpr) else v for v in key)
        return key if all(type(v) is int for v in key) else None

    def cached_tensor_init(self, handle, type):
        key = ints(type.shape) if type.is_block() else ()
        hit = tensor_shapes.get(key) if key is not None else None
        if hit is None:
            tensor_init(self, handle, type)
            if key is not None:
                tensor_shapes[key] = (self.shape, self.numel)
            return
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self.shape, self.numel = hit

    def cached_block_init(self, element_ty, shape):
        key = ints(shape) if isinstance(shape, (list, core.tuple)) else None   # as Triton's assert
        hit = block_shapes.get(key) if key is not None else None
        if hit is None:
            block_init(self, element_ty, shape)
            if key is not None:
                block_shapes[key] = (self.shape, self.numel, str(self.shape))
            return
        self.element_ty = element_ty
        self.shape, self.numel, text = hit
        self.name = f"<{text}, {element_ty}>"

    def tuple_type_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [''] * len(types)

    def tuple_type_name(self):
        return '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']'

    cached_tensor_init._vegas_shortcut = True
    core.tensor.__init__ = cached_tensor_init
    core.block_type.__init__ = cached_block_init
    core.tuple_type.__init__ = tuple_type_init
    core.tuple_type.name = property(tuple_type_name)
    return True


def install_no_dead_checks() -> bool:
    """Third shortcut: no work whose result the interpreter throws away.

    Why: with `sanitize_overflow` on (the interpreter's default, as on the GPU), every 32-bit
    integer add, subtract and multiply is computed again in 64 bits and compared with the type's
    range, and the result goes to `device_assert`, which does nothing unless `debug` is on (the
    interpreter's `debug` is always off; compiled, the same dead IR is removed). That is about
    1 ms of Python per integer op: a quarter of the time of the CUDA-graph path test
    (tests/vegas_core/test_graphs.py, cProfile). And the interpreter looks up each value's NumPy
    dtype by building a 21-entry dict for every lookup (`_get_np_dtype`).

    What changes: `sanitize_overflow` is turned off while `debug` is off (nothing is asserted
    either way); NumPy dtypes are looked up once per Triton element type. What a kernel computes
    does not change. False (and nothing changed) where this Triton's interpreter is not the one
    described."""
    import dataclasses
    try:
        from triton.language import core
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    np_dtype = getattr(interpreter, "_get_np_dtype", None)
    options = getattr(builder, "options", None)
    if np_dtype is None or getattr(np_dtype, "_vegas_shortcut", False) or \
            not dataclasses.is_dataclass(options) or not hasattr(options, "sanitize_overflow"):
        return False
    if not options.debug:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)

    found: dict = {}

    def cached_np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, core.block_type) else tt_dtype
        if isinstance(key, core.pointer_type):    # unhashable; every pointer is stored as uint64
            key = "pointer"
        hit = found.get(key)
        if hit is None:
            hit = found[key] = np_dtype(tt_dtype)
        return hit

    cached_np_dtype._vegas_shortcut = True
    interpreter._get_np_dtype = cached_np_dtype
    return True

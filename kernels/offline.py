"""Compile a Triton kernel launch for a GPU this machine does not have, and read what the compiler
made of it: registers, local memory (spills), shared memory, the MMA layouts, and per loop the
barriers, shared-memory and tensor-core instructions of the SASS.

Why: device time is scarce (bench/NOTES.md), and some questions about a kernel are answered by
the compiler, not the clock: whether a change leaves the engine's kernels as they were (the same
SASS), whether a launch spills under its register cap, how many programs an SM can hold, how
many barriers a key tile pays. Triton's wheel carries ptxas and cuobjdump, so the whole
pipeline down to SASS runs on a CPU-only machine. Timing still needs the GPU.

A launch is compiled exactly as the JIT would compile it on the device: the arguments go through
Triton's own specialisation (integers equal to 1 become constants, 16-divisible pointers and
integers carry that hint), so the same call that `kernel[grid](...)` makes is what `record`
captures and `compile_launch` compiles.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as triton_compile, make_backend
from triton.runtime.jit import create_function_from_signature

SM90 = GPUTarget("cuda", 90, 32)     # the H200 (Hopper) the device tool lends
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
# SASS opcodes counted per loop: barriers, global loads (plain and async into shared memory),
# shared-memory traffic, tensor-core products (HMMA: mma.sync; HGMMA: Hopper's warp-group wgmma),
# warp shuffles, special functions (exp), spills.
COUNTED = ("BAR", "LDG", "LDGSTS", "STS", "LDS", "LDSM", "HMMA", "HGMMA", "SHFL", "MUFU", "STL",
           "LDL")


@dataclass
class Launch:
    grid: tuple
    args: tuple
    kwargs: dict


@dataclass
class LoopStats:
    start: int               # SASS byte offsets of the loop's first and last (branch) instruction
    end: int
    instructions: int
    ops: dict[str, int]      # COUNTED opcodes inside the loop


@dataclass
class SassStats:
    registers: int
    stack: int               # bytes of local memory a thread (spills, or arrays the compiler put there)
    shared: int              # bytes of shared memory a program
    mma: list[str]           # the MMA layouts of the TTGIR (version, warpsPerCTA, instrShape)
    instructions: int
    ops: dict[str, int]
    sass_sha256: str         # of the instruction text: equal for the same kernel whatever the source lines
    loops: list[LoopStats] = field(default_factory=list)

    @property
    def main_loop(self) -> LoopStats | None:
        """The loop with the most instructions (a kernel's per-tile work)."""
        return max(self.loops, key=lambda lp: lp.instructions, default=None)


@contextlib.contextmanager
def record(module, name: str):
    """Replace ``module.name`` (a JIT kernel) by a recorder while the block runs: each
    ``kernel[grid](*args, **kwargs)`` appends a `Launch` to the yielded list instead of running.
    Yields (the kernel, the list)."""
    kernel = getattr(module, name)
    launches: list[Launch] = []

    class _Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(Launch(grid, args, kwargs))

    setattr(module, name, _Recorder())
    try:
        yield kernel, launches
    finally:
        setattr(module, name, kernel)


def compile_launch(kernel, launch: Launch, target: GPUTarget = SM90):
    """Triton's compiled kernel (``asm`` holds ttgir, ptx and cubin) for ``launch`` on ``target``,
    specialised from its arguments as the JIT specialises them."""
    if not hasattr(kernel, "_pack_args"):
        raise RuntimeError(f"{kernel!r} is interpreted (TRITON_INTERPRET=1 when it was decorated): "
                           "compile offline in a process started without it")
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(launch.kwargs)
    kwargs.setdefault("debug", False)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization,
                                                              options)
    return triton_compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=options.__dict__)


def _cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        run = subprocess.run([os.path.join(_BIN, "cuobjdump"), flag, f.name], capture_output=True,
                             text=True, check=True)
    finally:
        os.unlink(f.name)
    return run.stdout


def sass_instructions(compiled) -> list[tuple[int, str]]:
    """(byte offset, instruction text) of the kernel's SASS."""
    sass = _cuobjdump(compiled.asm["cubin"], "-sass")
    return [(int(m[1], 16), m[2]) for m in
            re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)]


def _opcode(text: str) -> str:
    text = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)       # a predicate guard
    return text.split()[0].split(".")[0]


def sass_stats(compiled) -> SassStats:
    """What the compiler made of ``compiled`` (see the module docstring). A loop is a backward
    branch: the instructions from its target to it."""
    usage = _cuobjdump(compiled.asm["cubin"], "-res-usage")
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:\d+", usage)
    if m is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output:\n{usage}")
    ins = sass_instructions(compiled)
    ops = Counter(_opcode(t) for _, t in ins)
    loops = []
    for addr, text in ins:
        branch = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if branch and int(branch[1], 16) < addr:
            start = int(branch[1], 16)
            body = Counter(_opcode(t) for a, t in ins if start <= a <= addr)
            loops.append(LoopStats(start, addr, sum(body.values()), {o: body[o] for o in COUNTED}))
    mma = sorted(set(re.findall(r"nvidia_mma<\{([^}]*)\}>", compiled.asm["ttgir"])))
    text = "\n".join(t for _, t in ins)
    return SassStats(registers=int(m[1]), stack=int(m[2]), shared=compiled.metadata.shared, mma=mma,
                     instructions=len(ins), ops={o: ops[o] for o in COUNTED},
                     sass_sha256=hashlib.sha256(text.encode()).hexdigest(), loops=loops)

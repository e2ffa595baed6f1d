"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched with it may start while
the kernel before it on the stream is still finishing, and waits (``griddepcontrol.wait``) for that
kernel's memory before it reads or writes anything. A decode step at batch 64 is about 300 kernels of
2-10 us each, captured in a CUDA graph; PDL hides part of the gap between two of them (the next
grid's launch and its programs' start-up overlap the previous grid's tail).

Contract: a kernel that takes ``USE_PDL: tl.constexpr`` calls ``pdl_wait(USE_PDL)`` before its first
memory access, and is launched with ``**launch_options(device)``. The wait comes before any access
(not only before reading the previous kernel's output) so the order holds transitively: a kernel
that waits on its predecessor has seen everything that predecessor waited on. Kernels without it
(cuBLAS, torch ops) launch as usual and wait for everything before them. A launch uses it when its
caller asks (`options.KernelOptions.pdl`), never under the interpreter or before compute capability 9.
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

def active(device: torch.device, enabled: bool) -> bool:
    """Whether a kernel launched on `device` whose caller asks for PDL (`enabled`) uses it."""
    if not enabled or triton is None or triton.knobs.runtime.interpret:
        return False
    device = torch.device(device)
    return device.type == "cuda" and _hopper_or_later(device.index)


@functools.lru_cache(maxsize=None)
def _hopper_or_later(index: int | None) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def launch_options(device: torch.device, enabled: bool) -> dict:
    """The keyword arguments a launch adds: the kernel's USE_PDL and Triton's launch_pdl."""
    on = active(device, enabled)
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


if triton is not None:

    @triton.jit
    def pdl_wait(USE_PDL: tl.constexpr):
        """Wait for the previous kernel's memory, then let the next kernel start launching (its
        programs wait the same way before touching memory, so launching them early is safe)."""
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

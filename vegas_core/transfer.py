"""Small host <-> device copies that do not stall the host behind the GPU.

A blocking copy from host memory to the GPU (torch's default, `torch.tensor(..., device=...)`)
synchronises the stream, so the host waits until the GPU has finished everything queued before
it: at batch 64 the selection step's four little uploads waited out a whole verification (about
5 ms; `scripts/device/profile_step.py`, bench/NOTES.md). Through pinned memory with
`non_blocking=True` the upload is queued instead; the device->host direction returns an event
to wait on, so the host can queue more work before it needs the values."""
from __future__ import annotations

import torch


def to_device(values, dtype: torch.dtype, device) -> torch.Tensor:
    """`values` (a list, nested lists or a host tensor) as a `dtype` tensor on `device`, without
    waiting for the GPU (pinned, non-blocking); a plain copy on a CPU."""
    host = torch.as_tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def to_host_async(t: torch.Tensor):
    """A host copy of `t` and an event that completes with it (None on a CPU, where the copy is
    done on return). On a GPU the copy goes to pinned memory without blocking the host, so the
    host can launch more work before it waits for the copy alone. Either way it is a copy: work
    launched after it may overwrite `t`."""
    if t.device.type != "cuda":
        return t.clone(), None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done

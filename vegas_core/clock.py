"""Points in time for an iteration's phases: CUDA events on a GPU (recorded in stream order, so
marking never waits for the GPU mid-iteration), the wall clock on a CPU."""
from __future__ import annotations

import time

import torch


class DeviceClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start, end) -> float:
        """Milliseconds between two marks (on a GPU valid once `end` has completed: `wait` first)."""
        if self.cuda:
            return start.elapsed_time(end)
        return (end - start) * 1e3

    def wait(self, mark) -> None:
        """Wait until the GPU has reached `mark`, not for work queued after it."""
        if self.cuda:
            mark.synchronize()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


class PhaseTimes:
    """One iteration's (start, end) marks per phase: draft, verify and select (several spans)."""

    def __init__(self, clock: DeviceClock):
        self.clock = clock
        self.spans: dict[str, list[tuple]] = {"draft": [], "verify": [], "select": []}

    def add(self, phase: str, span: tuple) -> None:
        self.spans[phase].append(span)

    def ms(self) -> dict[str, float]:
        return {f"{phase}_ms": sum(self.clock.ms(a, b) for a, b in spans)
                for phase, spans in self.spans.items()}

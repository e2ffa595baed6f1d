"""What the device probes (`scripts/device/probe_*.py`) share: the dry-run switch, the device, the
measured copy ceiling, the timer, and where and how the results are written.

PROBE_DRY=1 runs a probe as a tiny case on the CPU under TRITON_INTERPRET=1 (is the script sound
before the device?): every timed call runs once and "takes" 1 us, the copy ceiling is 1 TB/s, and
nothing is written."""
from __future__ import annotations

import datetime
import json
import os
from typing import NamedTuple

import torch

from vegas_core.bench.common import copy_bandwidth, device_description
from vegas_core.bench.kernels import _bench


class Probe(NamedTuple):
    dry: bool
    dev: torch.device
    copy_TBps: float
    bench: object      # fn -> median microseconds of fn()


def setup() -> Probe:
    dry = os.environ.get("PROBE_DRY") == "1"
    dev = torch.device("cpu" if dry else "cuda")
    if dry:
        return Probe(True, dev, 1.0, lambda fn: (fn(), 1.0)[1])
    return Probe(False, dev, copy_bandwidth(dev), _bench)


def write(probe: Probe, name: str, command: str, records: list[dict], **extra) -> str | None:
    """$OUT/results/<name>.json with the date, device, command, copy ceiling and records; None in
    a dry run."""
    if probe.dry:
        print(f"dry run: {len(records)} records")
        return None
    out = os.path.join(os.environ.get("OUT", "/tmp"), "results")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(dict(date=datetime.date.today().isoformat(), device=device_description(probe.dev),
                       command=command, torch=torch.__version__, copy_TBps=probe.copy_TBps,
                       **extra, records=records), f, indent=1)
    print("wrote", path)
    return path

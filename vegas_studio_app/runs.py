"""The runs a browser session has made or loaded (Generate runs, compare runs, replayed traces), behind
the run selector that every tab shares: the KV, acceptance and breakdown views draw the selected run and
only the runs on the same prompt beside it, so no plot mixes prompts. Bounded: the oldest runs go
first (the selected one stays).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from visualizations.provenance import file_provenance, live_provenance

MAX_RUNS = 24


@dataclass(eq=False)
class Run:
    run_id: str
    kind: str                    # "generate", "compare" or "replay"
    trace: object
    provenance: str              # "measured live on cpu, <date>" or "from <file>, <date>, <device>"
    group: str | None = None     # the compare it belongs to
    selected_sets: dict = field(default_factory=dict)   # live runs: iteration index -> Selection chosen there
    draws: dict = field(default_factory=dict)           # live runs: iteration index -> acceptance uniforms

    @property
    def method(self) -> str:
        return self.trace.config.method

    @property
    def prompt_ids(self) -> tuple:
        reqs = self.trace.requests
        return tuple(reqs[0].prompt_token_ids) if reqs else ()

    @property
    def label(self) -> str:
        req = self.trace.requests[0] if self.trace.requests else None
        text = (req.prompt_text or "") if req else ""
        snippet = (text[:28] + "…") if len(text) > 28 else text
        what = {"generate": "Generate", "compare": f"compare {self.group}", "replay": "replay"}[self.kind]
        size = f"{len(req.prompt_token_ids)}+{len(req.output_token_ids)} tokens" if req else "no requests"
        return f"#{self.run_id} {what} · {self.method} · “{snippet}” · {size}"

    @property
    def legend(self) -> str:
        """The name in a plot's legend: the method, and which compare or run it was."""
        return f"{self.method} (compare {self.group})" if self.kind == "compare" else f"{self.method} (#{self.run_id})"


class RunLog:
    def __init__(self, capacity: int = MAX_RUNS):
        self.capacity = capacity
        self._runs: dict[str, Run] = {}
        self._next = 1
        self.groups = 0

    def add(self, kind: str, trace, source: str | None = None, group: str | None = None,
            keep: str | None = None) -> Run:
        """A new run; `source` names an uploaded file (provenance "from <file>…"), else it was measured
        live. `keep`: a run id not to drop when over capacity (the selected one)."""
        prov = (file_provenance(source, trace.created, trace.model.device) if source else live_provenance(trace))
        run = Run(str(self._next), kind, trace, prov, group)
        self._next += 1
        self._runs[run.run_id] = run
        for rid in list(self._runs):
            if len(self._runs) <= self.capacity:
                break
            if rid not in (keep, run.run_id):
                del self._runs[rid]
        return run

    def new_group(self) -> str:
        self.groups += 1
        return str(self.groups)

    def get(self, run_id) -> Run | None:
        return self._runs.get(str(run_id)) if run_id is not None else None

    def choices(self) -> list[tuple[str, str]]:
        return [(r.label, r.run_id) for r in reversed(self._runs.values())]

    def same_prompt(self, run: Run) -> list[Run]:
        """The run first, then the other runs on exactly its prompt: its compare siblings, and runs of
        other sessions' settings on the same prompt (labelled by method and run)."""
        return [run] + [r for r in self._runs.values() if r is not run and r.prompt_ids == run.prompt_ids]

    def __len__(self) -> int:
        return len(self._runs)

"""Helpers shared by engine tests."""


def run_forked(core, prompts, sampling, specs):
    """Prefill each prompt once as a vanilla parent, fork one child per spec, run everything.
    Returns (parents, {spec: children})."""
    from vegas_core.spec import SpecParams
    parents = [core.add_request(p, sampling, SpecParams(method="vanilla")) for p in prompts]
    while any(p.needs_prefill for p in parents):
        core.step()
    children = {spec: [core.fork(p, sampling, spec) for p in parents] for spec in specs}
    core.run()
    return parents, children

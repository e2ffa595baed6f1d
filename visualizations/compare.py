"""Side-by-side comparison of runs of the same prompt, and the losslessness check.

Speculative decoding is lossless: at temperature 0 every method must emit exactly vanilla's tokens.
`lossless_check` compares each run's output ids with the reference run's and reports the first index
where they differ (None when identical); a shorter output that is a prefix of the other is a divergence
at its end (one run stopped early), not a pass.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._common import esc, token_text, visible
from .breakdown import step_breakdown


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where the sequences differ (or where the shorter ends); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _request(run):
    return run.requests[0] if getattr(run, "requests", None) else None


def lossless_check(runs: Mapping[str, object], reference: str = "vanilla") -> dict:
    """{'reference', 'applicable', 'passed', 'results': {label: {'identical', 'divergence', 'ref_token',
    'token', 'context'}}}. `applicable` is False when a run sampled (temperature > 0): then outputs may
    differ by design and `passed` is None."""
    if reference not in runs:
        return {"reference": None, "applicable": False, "passed": None, "results": {},
                "reason": f"no {reference!r} run to compare against"}
    ref = _request(runs[reference])
    sampled = [k for k, r in runs.items() if getattr(r, "config", None) and r.config.temperature > 0]
    results = {}
    for label, run in runs.items():
        if label == reference:
            continue
        req = _request(run)
        a, b = list(ref.output_token_ids), list(req.output_token_ids) if req else []
        d = first_divergence(a, b)
        tt = run.token_texts if hasattr(run, "token_texts") else {}
        info = {"identical": d is None, "divergence": d, "ref_token": None, "token": None, "context": ""}
        if d is not None:
            info["ref_token"] = visible(token_text(tt, a[d])) if d < len(a) else "(end)"
            info["token"] = visible(token_text(tt, b[d])) if d < len(b) else "(end)"
            info["context"] = visible("".join(token_text(tt, t) for t in a[max(0, d - 8):d]))
        results[label] = info
    if sampled:
        return {"reference": reference, "applicable": False, "passed": None, "results": results,
                "reason": f"sampled at temperature > 0 ({', '.join(sampled)}): outputs may differ by design"}
    return {"reference": reference, "applicable": True, "results": results,
            "passed": all(r["identical"] for r in results.values()), "reason": ""}


def compare_rows(runs: Mapping[str, object]) -> list[dict]:
    """One row per run: method, tokens, tokens/s, mean acceptance length, iterations and step breakdown."""
    rows = []
    for label, run in runs.items():
        req = _request(run)
        if req is None:
            continue
        bd = step_breakdown(run) or {"draft": 0.0, "select": 0.0, "verify": 0.0}
        rows.append({
            "method": label, "tokens": len(req.output_token_ids), "tokens_per_s": req.decode_tokens_per_s,
            "mean_acceptance_length": req.mean_acceptance_length, "iterations": req.num_iterations,
            "draft_ms": bd["draft"], "select_ms": bd["select"], "verify_ms": bd["verify"],
            "output_text": req.output_text,
        })
    return rows


def _fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def compare_table_html(runs: Mapping[str, object], reference: str = "vanilla") -> str:
    """The comparison table followed by the lossless verdict (a `data-lossless` attribute carries it)."""
    rows = compare_rows(runs)
    if not rows:
        return "<div class='vs-compare'><em>No comparison yet: press Run compare.</em></div>"
    check = lossless_check(runs, reference)
    res = check["results"]
    body = []
    for r in rows:
        info = res.get(r["method"])
        if r["method"] == reference:
            same = "reference"
        elif info is None:
            same = "–"
        elif info["identical"]:
            same = "✔ identical"
        else:
            same = (f"✘ differs at token {info['divergence']}: {esc(repr(info['ref_token']))} vs "
                    f"{esc(repr(info['token']))} after “{esc(info['context'])}”")
        body.append(
            f"<tr data-method='{esc(r['method'])}'><td><b>{esc(r['method'])}</b></td><td>{r['tokens']}</td>"
            f"<td>{_fmt(r['tokens_per_s'], '.1f')}</td><td>{_fmt(r['mean_acceptance_length'], '.2f')}</td>"
            f"<td>{r['iterations']}</td><td>{r['draft_ms']:.1f} / {r['select_ms']:.1f} / {r['verify_ms']:.1f}</td>"
            f"<td>{same}</td><td style='max-width:340px;font-size:12px'>{esc(r['output_text'][:200])}</td></tr>")
    if check["passed"] is True:
        verdict, state = f"Lossless check passed: every method's output is identical to {reference}'s.", "pass"
    elif check["passed"] is False:
        bad = [k for k, v in res.items() if not v["identical"]]
        verdict, state = f"Lossless check FAILED: {', '.join(bad)} differ from {reference} (see where above).", "fail"
    else:
        verdict, state = f"Lossless check not applicable: {check['reason']}.", "n/a"
    color = {"pass": "#2b8a3e", "fail": "#c92a2a", "n/a": "#868e96"}[state]
    head = ("<tr><th>method</th><th>tokens</th><th>tokens/s</th><th>mean acc. length</th><th>iterations</th>"
            "<th>draft / select / verify ms per step</th><th>vs reference</th><th>output</th></tr>")
    return (f"<div class='vs-compare' data-lossless='{state}'><table>{head}{''.join(body)}</table>"
            f"<p class='vs-lossless' style='color:{color};font-weight:bold'>{esc(verdict)}</p></div>")

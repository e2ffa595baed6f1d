"""Side-by-side comparison of runs of the same prompt, and the losslessness check.

Speculative decoding is lossless: at temperature 0 every method must emit exactly vanilla's tokens; at
temperature > 0 its output has the same distribution (not the same text), which one run cannot show.
`lossless_check` compares each run's output ids with the reference run's and reports the first index
where they differ (None when identical); a shorter output that is a prefix of the other is a divergence
at its end (one run stopped early), not a pass.
"""
from __future__ import annotations

import difflib
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


def compare_rows(runs: Mapping[str, object], reference: str = "vanilla") -> list[dict]:
    """One row per run: method, tokens, tokens/s, mean acceptance length, iterations, step breakdown, and
    the ratios to the reference run: tokens/s and mean time per iteration (draft + select + verify of
    an engine step), None without a reference."""
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
            "iteration_ms": bd["draft"] + bd["select"] + bd["verify"], "output_text": req.output_text,
        })
    ref = next((r for r in rows if r["method"] == reference), None)
    for r in rows:
        r["speedup"] = _ratio(r["tokens_per_s"], ref and ref["tokens_per_s"])
        r["iteration_time_ratio"] = _ratio(r["iteration_ms"], ref and ref["iteration_ms"])
    return rows


def _ratio(x, ref):
    return x / ref if x is not None and ref else None


def _fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def token_diff_html(run, ref_run, label: str, reference: str = "vanilla") -> str:
    """Both outputs token by token from their common prefix on: equal tokens plain, the reference's
    differing tokens struck through in red, the method's in green (difflib over token ids)."""
    a, b = list(_request(ref_run).output_token_ids), list(_request(run).output_token_ids)
    texts = {**getattr(ref_run, "token_texts", {}), **getattr(run, "token_texts", {})}
    tok = lambda t: esc(visible(token_text(texts, t)))  # noqa: E731
    start = max(0, (first_divergence(a, b) or 0) - 8)
    spans = [] if start == 0 else ["… "]
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a[start:], b=b[start:], autojunk=False).get_opcodes():
        if op == "equal":
            spans += [f"<span>{tok(t)}</span>" for t in a[start + i1:start + i2]]
            continue
        spans += [f"<del data-side='{esc(reference)}' style='background:#ffc9c9'>{tok(t)}</del>"
                  for t in a[start + i1:start + i2]]
        spans += [f"<ins data-side='{esc(label)}' style='background:#b2f2bb'>{tok(t)}</ins>"
                  for t in b[start + j1:start + j2]]
    return (f"<div class='vs-diff' data-method='{esc(label)}'><b>{esc(label)} vs {esc(reference)}</b>, token by token "
            f"from 8 tokens before the first difference (red: only in {esc(reference)}, green: only in "
            f"{esc(label)}):<div style='font-family:ui-monospace,monospace;white-space:pre-wrap'>{''.join(spans)}"
            "</div></div>")


SAMPLED_MEANING = ("At temperature > 0 lossless means the same distribution, not identical text: every method's "
                   "output is a sample from exactly the distribution plain sampling draws from, so two runs "
                   "differ as two vanilla runs with different seeds would. One sample cannot show that; the "
                   "rejection-sampler tests check it over thousands of samples "
                   "(tests/vegas_core/spec/test_sampled_lossless.py, tests/vegas_core/test_rejection.py).")


def _verdict(check: dict, res: dict, reference: str, missing: list[str], sampled: bool) -> tuple[str, str]:
    if missing:
        return (f"Lossless check pending: waiting for {', '.join(missing)} (the verdict comes when every "
                "method has finished).", "pending")
    if sampled:
        return f"Lossless check by identical output does not apply. {SAMPLED_MEANING}", "n/a"
    if check["passed"] is True:
        return f"Lossless check passed: every method's output is identical to {reference}'s (temperature 0).", "pass"
    if check["passed"] is False:
        bad = [k for k, v in res.items() if not v["identical"]]
        return f"Lossless check FAILED: {', '.join(bad)} differ from {reference} (see the diff below).", "fail"
    return f"Lossless check not applicable: {check['reason']}.", "n/a"


def compare_table_html(runs: Mapping[str, object], reference: str = "vanilla",
                       expected: Sequence[str] | None = None) -> str:
    """The comparison table, the lossless verdict (a `data-lossless` attribute carries it: pass, fail,
    n/a or pending while some of `expected` have not finished) and a token diff per differing run."""
    rows = compare_rows(runs, reference)
    if not rows:
        return "<div class='vs-compare'><em>No comparison yet: press Run compare.</em></div>"
    check = lossless_check(runs, reference)
    res = check["results"]
    missing = [m for m in (expected or []) if m not in runs]
    sampled = any(getattr(r, "config", None) and r.config.temperature > 0 for r in runs.values())
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
            f"<td>{_fmt(r['tokens_per_s'], '.1f')}</td><td data-col='speedup'>{_fmt(r['speedup'], '.2f')}×</td>"
            f"<td>{r['iteration_ms']:.1f}</td><td data-col='iteration-ratio'>{_fmt(r['iteration_time_ratio'], '.2f')}×</td>"
            f"<td>{_fmt(r['mean_acceptance_length'], '.2f')}</td><td>{r['iterations']}</td>"
            f"<td>{r['draft_ms']:.1f} / {r['select_ms']:.1f} / {r['verify_ms']:.1f}</td>"
            f"<td>{same}</td><td style='max-width:340px;font-size:12px'>{esc(r['output_text'][:200])}</td></tr>")
    verdict, state = _verdict(check, res, reference, missing, sampled)
    color = {"pass": "#2b8a3e", "fail": "#c92a2a", "n/a": "#495057", "pending": "#868e96"}[state]
    head = ("<tr><th>method</th><th>tokens</th><th>tokens/s</th><th title='tokens/s ÷ vanilla tokens/s'>× vanilla "
            "tokens/s</th><th>ms per iteration</th><th title='ms per iteration ÷ vanilla ms per iteration'>× vanilla "
            "iteration time</th><th title='1 + accepted drafts per speculative iteration (the drafter count)'>mean "
            "acc. length</th><th>iterations</th><th>draft / select / verify ms per step</th><th>vs reference</th>"
            "<th>output</th></tr>")
    diffs = "" if reference not in runs else "".join(
        token_diff_html(runs[k], runs[reference], k, reference) for k, v in res.items() if not v["identical"])
    return (f"<div class='vs-compare' data-lossless='{state}'><table>{head}{''.join(body)}</table>"
            f"<p class='vs-lossless' style='color:{color};font-weight:bold'>{esc(verdict)}</p>{diffs}</div>")

"""The step-through cards: the four stages, the acceptance rule, unchecked drafts, the per-layer strip
of the set chosen by Select, and what each method's Select does."""
import re

from tests.visualizations.conftest import TEXTS, config, model, spec_trace
from visualizations import iteration_stages_html, selection_strip_html


def _stages(html):
    return re.findall(r'data-stage="(\w+)"', html)


def test_four_stages_numbered_from_one_with_the_greedy_rule(trace):
    its = trace.requests[0].iterations
    html = iteration_stages_html(its[1], TEXTS, trace.config, trace.model, selected=its[2].selection)
    assert _stages(html) == ["draft", "verify", "accept", "select"]
    assert 'data-iteration="2"' in html and "<b>Iteration 2</b>" in html
    assert "Rule (temperature 0)" in html and "target's argmax" in html
    assert "2 of 3 drafts accepted (the drafter's count)" in html and "3 token(s) emitted" in html
    assert re.findall(r"data-outcome='(\w+)'", html) == ["accepted", "accepted", "rejected"]
    assert "Collect-2-Query" in html and "Kept 2 of 8 entries per KV head" in html
    # Two strips: the set the drafts attended (Draft) and the set kept for the next drafts (Select).
    assert html.count('class="vs-strip"') == 2


def test_a_cut_iteration_says_so(trace):
    it = trace.requests[0].iterations[2].model_copy(update={"emitted": [15, 16]})
    html = iteration_stages_html(it, TEXTS, trace.config, trace.model)
    assert "3 of 3 drafts accepted" in html and "2 token(s) emitted" in html and "ended inside" in html
    assert "not available: the run ended" in html


def test_sampled_rule_and_draws():
    trace = spec_trace(temperature=0.7)
    it = trace.requests[0].iterations[1]
    html = iteration_stages_html(it, TEXTS, trace.config, trace.model, accept_draws=[0.5, 0.25, 0.99])
    assert "Rule (temperature 0.7)" in html and "min(1, p" in html and "norm(max(0, p − q))" in html
    assert re.findall(r"data-draw='(\d)'>([\d.–]+)<", html) == [("0", "0.500"), ("1", "0.250"), ("2", "0.990")]
    no_draws = iteration_stages_html(it, TEXTS, trace.config, trace.model)
    assert "traces do not keep them" in no_draws


def test_quest_select_describes_quest_not_vegas():
    trace = spec_trace(method="quest")
    its = trace.requests[0].iterations
    html = iteration_stages_html(its[1], TEXTS, trace.config, trace.model)
    select = html[html.index('data-stage="select"'):]
    assert "Quest keeps each page" in select and "Collect-2-Query" not in select
    vanilla = iteration_stages_html(its[0], TEXTS, config("vanilla"), model())
    assert "No selection: vanilla" in vanilla


def test_strip_has_a_row_per_layer_with_its_kept_count(trace):
    sel = trace.requests[0].iterations[1].selection          # layer sets [[0, 1], [0, 5], [2, 3, 4], [0]]
    html = selection_strip_html(sel, 4)
    assert re.findall(r'data-layer="(\d)" data-kept="(\d)"', html) == [("0", "2"), ("1", "2"), ("2", "3"), ("3", "1")]

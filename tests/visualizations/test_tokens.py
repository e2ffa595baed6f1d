import re

from tests.visualizations.conftest import OUTPUT, TEXTS
from vegas_core.trace import DraftToken, Iteration
from visualizations import counters_html, stream_pieces, token_stream_html


def test_pieces_carry_each_tokens_fate(trace):
    req = trace.requests[0]
    pieces = stream_pieces(req.iterations, trace.token_texts, req.output_token_ids)
    assert [(p.token_id, p.kind) for p in pieces] == [
        (10, "decode"), (11, "accepted"), (12, "accepted"), (13, "rejected"), (14, "correction"),
        (15, "accepted"), (16, "accepted"), (17, "accepted"), (18, "bonus")]
    # Everything but the rejected drafts is the output, in order.
    assert [p.token_id for p in pieces if p.kind != "rejected"] == OUTPUT
    assert pieces[1].text == " lazy" and pieces[3].iteration == 2     # numbered from 1


def test_output_ids_cap_a_cut_short_last_iteration(trace):
    req = trace.requests[0]
    pieces = stream_pieces(req.iterations, trace.token_texts, OUTPUT[:6])   # stop after " was"
    assert [p.token_id for p in pieces if p.kind != "rejected"] == OUTPUT[:6]


def test_stream_html_colours_and_hides_rejected_unless_asked(trace):
    req = trace.requests[0]
    pieces = stream_pieces(req.iterations, trace.token_texts, req.output_token_ids)
    html = token_stream_html(pieces)
    kinds = re.findall(r'data-kind="(\w+)"', html)
    assert kinds.count("accepted") == 5 and kinds.count("rejected") == 1
    assert kinds.count("correction") == 1 and kinds.count("bonus") == 1 and kinds.count("decode") == 1
    assert 'class="vs-stream"' in html and "line-through" in html
    assert 'data-accepted="5"' in html
    assert 'class="vs-stream show-rejected"' in token_stream_html(pieces, show_rejected=True)
    # Text is escaped.
    assert "&lt;b&gt;" in token_stream_html(stream_pieces(req.iterations, {10: "<b>"}, None))


def test_missing_token_text_is_visible_placeholder(trace):
    req = trace.requests[0]
    pieces = stream_pieces(req.iterations, {}, None)
    assert pieces[0].text == "⟨10⟩"


def test_an_iteration_cut_by_max_tokens_shows_only_what_was_output(trace):
    it = trace.requests[0].iterations[2].model_copy(update={"emitted": [15, 16]})   # max_tokens hit after " was"
    pieces = stream_pieces([it], trace.token_texts)
    assert [(p.token_id, p.kind) for p in pieces] == [(15, "accepted"), (16, "accepted")]


def test_drafts_after_the_first_rejection_are_marked_unchecked():
    drafts = [DraftToken(token_id=t, draft_prob=0.9, target_prob=0.2, accepted=False) for t in (11, 12, 13)]
    it = Iteration(index=4, step=6, position=9, drafts=drafts, num_accepted=0, emitted=[14], final_token=14,
                   final_kind="correction")
    titles = [p.title for p in stream_pieces([it], TEXTS)]
    assert "draft 1: rejected" in titles[0] and "not checked" in titles[1] and "not checked" in titles[2]
    assert titles[0].startswith("iteration 5")


def test_counters_show_values():
    html = counters_html(12, 3.456, 2.5, 4, "streaming")
    assert 'data-counter="tokens_per_s">3.5<' in html and 'data-counter="mean_acceptance_length">2.50<' in html
    assert 'data-counter="mean_acceptance_length">–<' in counters_html(1, None, None, 1)
    assert "tokens emitted" in html and "mean acceptance length (accepted)" in html

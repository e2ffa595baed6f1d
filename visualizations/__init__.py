"""Pure functions from traces (or benchmark records) to Plotly figures and HTML strings.

Contract: nothing here loads a model, touches the engine or does I/O except `overhead.load_kernel_results`
and `throughput.load_e2e_results`
(read committed benchmark JSON) and `export.write_figures` (writes files it is asked to). Every builder
takes plain trace data (`vegas_core.trace` models or objects shaped like them) and returns a new
`plotly.graph_objects.Figure` or an HTML string, so the app, the tests and a notebook share them.

    tokens.py      token stream coloured by fate, live counters
    stages.py      step-through cards: draft, verify, accept (with the rule), select (with a layer strip)
    strip.py       a compact per-layer strip of one KV selection
    selection.py   KV selection heatmap (overview + zoom), prompt coloured by selection, recall per layer
    acceptance.py  per-position acceptance, accepted-length histogram, running mean acceptance length
    breakdown.py   draft / select / verify time per engine step, per method
    compare.py     compare table and the losslessness check (first divergence)
    overhead.py    logit-collection overhead (Collect-2-Query vs all rows) from bench/results/kernels-*.json
    throughput.py  every method's end-to-end tokens/s from bench/results/e2e-*.json
    sweep.py       vanilla / stream / vegas tokens/s over batch x context against the bandwidth bound
    export.py      figures to PNG / SVG (kaleido with a local Chromium) or self-contained HTML
"""
from .acceptance import accepted_length_histogram, per_position_acceptance_figure, running_mean_figure
from .breakdown import breakdown_figure, step_breakdown
from .compare import compare_rows, compare_table_html, first_divergence, lossless_check
from .overhead import KernelResults, load_kernel_results, overhead_figure, pick_kernel_results
from .selection import prompt_selection_html, recall_figure, selection_heatmaps, selection_matrix
from .sweep import sweep_figure
from .throughput import E2EResults, load_e2e_results, pick_results, throughput_figure
from .stages import iteration_stages_html
from .strip import selection_strip_html
from .tokens import counters_html, stream_pieces, token_stream_html

__all__ = [
    "E2EResults", "KernelResults", "accepted_length_histogram", "load_e2e_results", "pick_results",
    "throughput_figure", "breakdown_figure", "compare_rows", "compare_table_html",
    "counters_html", "first_divergence", "iteration_stages_html", "load_kernel_results", "lossless_check",
    "overhead_figure", "pick_kernel_results", "per_position_acceptance_figure", "prompt_selection_html",
    "recall_figure", "running_mean_figure", "selection_heatmaps", "selection_strip_html", "selection_matrix", "step_breakdown", "stream_pieces", "sweep_figure",
    "token_stream_html",
]

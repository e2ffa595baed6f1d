"""Vegas Studio's page: the layout and its event wiring (behaviour is in the modules beside it).

    vegas-studio [--model PATH|NAME] [--device cpu|cuda] [--host 127.0.0.1] [--port 7860] [--no-model]
(from a clone: python app.py ...)
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import gradio as gr

from vegas_core.bench.sweep import MAX_BATCH as SWEEP_MAX_BATCH
from vegas_core.engine import resolve_device
from vegas_core.spec import GRANULARITIES, METHODS
from vegas_studio_app.api import make_api
from vegas_studio_app.engine_process import ProcessWorker
from vegas_studio_app.models import model_choices, picker_value, wants_chat
from vegas_studio_app.studio import COMPARE_TOKENS_LIMIT, MAX_TOKENS_LIMIT, MAX_UPLOAD_BYTES, Studio
from vegas_studio_app.worker import EngineWorker
from visualizations.tokens import STREAM_CSS

# System fonts only: the page must not reach for web fonts (offline machines, headless tests).
THEME = gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
ENGINE = "engine"   # concurrency id shared by every event that puts requests into the one engine

CSS = STREAM_CSS + """
#token-stream { min-height: 120px; }
#token-stream.show-rejected .vs-rejected { display: inline; }
.vs-compare table { border-collapse: collapse; font-size: 13px; }
.vs-stages table { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
.vs-stages td, .vs-stages th { padding: 1px 6px; border-bottom: 1px solid #e9ecef; white-space: nowrap; }
.vs-compare td, .vs-compare th { border: 1px solid #dee2e6; padding: 3px 6px; vertical-align: top; }
"""
RESET_PAUSE_JS = "() => 'Pause'"
# Plotly sizes a plot drawn in a hidden tab at its default 700 px; Gradio makes plots responsive, so a
# resize event once the tab is shown lets each take its panel's width.
RESIZE_PLOTS_JS = "() => { setTimeout(() => window.dispatchEvent(new Event('resize')), 60); }"
TOGGLE_REJECTED_JS = """(show) => { const el = document.querySelector('#token-stream');
  if (el) { el.classList.toggle('show-rejected', show); } return show; }"""


def build_ui(studio: Studio, concurrency: int = 8, model: str | None = None) -> gr.Blocks:
    eng = dict(concurrency_id=ENGINE, concurrency_limit=concurrency)
    with gr.Blocks(title="Vegas Studio") as demo:
        gr.Markdown("# Vegas Studio\nSelf-speculative decoding with verification-guided sparse attention, "
                    "running on a real model. Numbers from your runs are measured live by the engine below; the "
                    "Overhead tab's kernel and throughput plots are read from committed benchmark files. Every "
                    "figure says which, under its title.")
        with gr.Row():
            status = gr.Markdown(elem_id="engine-status")
            model_picker = gr.Dropdown(model_choices(model), value=picker_value(model), elem_id="model",
                                       label="Model (switching reloads the engine every user shares)",
                                       interactive=studio.worker is not None)
        timer = gr.Timer(1.0)
        run_select = gr.Dropdown([], label="Run shown in every tab (Generate runs, compare runs, replayed traces; "
                                 "plots add only runs on the same prompt)", elem_id="run-select", interactive=True)

        with gr.Tab("Generate", id="generate") as tab_generate:
            with gr.Row():
                with gr.Column(scale=3):
                    prompt = gr.Textbox(label="Prompt", lines=4, elem_id="prompt",
                                        value="Explain in two sentences why the sky is blue.")
                    with gr.Row():
                        chat = gr.Checkbox(value=wants_chat(picker_value(model)), label="Chat template",
                                           elem_id="chat")
                        show_rejected = gr.Checkbox(value=False, label="Show rejected drafts", elem_id="show-rejected")
                    with gr.Row():
                        generate_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                        stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                        pause_btn = gr.Button("Pause", elem_id="pause-btn")
                        step_btn = gr.Button("Step", elem_id="step-btn")
                with gr.Column(scale=2):
                    method = gr.Dropdown(list(METHODS), value="vegas", label="Method", elem_id="method")
                    with gr.Row():
                        gamma = gr.Slider(1, 16, value=4, step=1, label="gamma (drafts per iteration)", elem_id="gamma")
                        sparsity = gr.Slider(0.01, 1.0, value=0.07, step=0.01, label="sparsity (kept fraction)",
                                             elem_id="sparsity")
                    with gr.Row():
                        min_budget = gr.Number(value=16, precision=0, minimum=0, label="min budget (paper: 256)",
                                               elem_id="min-budget")
                        granularity = gr.Dropdown(list(GRANULARITIES), value="layer", label="selection granularity")
                        record_recall = gr.Checkbox(value=False, label="record recall (slower)")
                    with gr.Accordion("Sampling", open=False):
                        with gr.Row():
                            temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature (0 = greedy)",
                                                    elem_id="temperature")
                            top_p = gr.Slider(0.01, 1, value=1, step=0.01, label="top-p")
                        with gr.Row():
                            top_k = gr.Number(value=0, precision=0, minimum=0, label="top-k (0 = off)")
                            seed = gr.Number(value=None, precision=0, label="seed (blank = random)")
                    max_tokens = gr.Number(value=64, precision=0, label=f"max tokens (1–{MAX_TOKENS_LIMIT})",
                                           elem_id="max-tokens")
            counters = gr.HTML(elem_id="counters")
            stream = gr.HTML(elem_id="token-stream")
            gr.Markdown("**Step-through** — Pause holds the request in the engine (its KV pages kept, other users' "
                        "requests go on); Step then runs exactly one more iteration and shows its draft, verify, "
                        "accept and select stages; Resume lets it run on. After a run (or for an uploaded trace), "
                        "Step walks through the recorded iterations from the first one. Iterations are numbered "
                        "from 1 everywhere. *Accepted* counts drafts the verifier accepted (the drafter's number, "
                        "as vLLM counts it); *emitted* counts tokens you got.")
            stages = gr.HTML(elem_id="stages")

        with gr.Tab("KV selection", id="kv") as tab_kv:
            with gr.Row():
                kv_request = gr.Dropdown([], label="request", elem_id="kv-request", allow_custom_value=True)
                kv_iter = gr.Slider(1, 2, value=1, step=1, label="iteration (from 1)", elem_id="kv-iteration")
                kv_start = gr.Slider(0, 1, value=0, step=1, label="zoom window start", elem_id="kv-start")
                kv_width = gr.Slider(16, 512, value=128, step=16, label="zoom window width", elem_id="kv-width")
            kv_overview = gr.Plot(label="Selection overview (whole context, binned)", elem_id="kv-overview")
            kv_zoom = gr.Plot(label="Selection zoom (full resolution)", elem_id="kv-zoom")
            gr.Markdown("**Context coloured by how many layers selected each token**")
            kv_prompt = gr.HTML(elem_id="kv-prompt")
            kv_recall = gr.Plot(label="Attention recall per layer", elem_id="kv-recall")

        with gr.Tab("Acceptance", id="acceptance") as tab_acc:
            acc_pos = gr.Plot(label="Per-position acceptance", elem_id="acc-position")
            with gr.Row():
                acc_hist = gr.Plot(label="Accepted drafts per iteration", elem_id="acc-hist")
                acc_run = gr.Plot(label="Running mean acceptance length", elem_id="acc-running")

        with gr.Tab("Overhead", id="overhead") as tab_overhead:
            overhead_note = gr.Markdown(elem_id="overhead-note")
            overhead_plot = gr.Plot(label="Logit-collection overhead", elem_id="overhead-plot")
            throughput_plot = gr.Plot(label="End-to-end throughput per method — from a committed file in "
                                      "bench/results (named under its title)", elem_id="throughput-plot")
            gr.Markdown("**Where does Vegas pay off?** Measured live on this app's engine: vanilla, stream and "
                        "vegas decode tokens/s over batch × context, against the bandwidth bound no plain decoder "
                        "passes (the weights and the batch's KV read once a step at the device's copy rate). At "
                        "batch 1 a small model is bound by kernel launches and speculation buys nothing; with a "
                        "large batch and long context the KV read dominates and sparse drafting can pass the bound.")
            with gr.Row():
                sweep_btn = gr.Button("Run sweep", variant="primary", elem_id="sweep-btn")
                sweep_stop = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
                sweep_export = gr.Button("Export sweep (JSON, SVG, PNG)", elem_id="sweep-export")
            sweep_status = gr.Markdown(elem_id="sweep-status")
            sweep_plot = gr.Plot(label="Throughput sweep — measured live on this app's engine", elem_id="sweep-plot")
            sweep_files = gr.File(label="Sweep downloads", file_count="multiple", interactive=False,
                                  elem_id="sweep-files")
            breakdown_plot = gr.Plot(label="Iteration breakdown per method", elem_id="breakdown-plot")

        with gr.Tab("Compare", id="compare") as tab_compare:
            gr.Markdown("Runs the Generate tab's prompt (and gamma, sparsity, budget) through vanilla and each "
                        "chosen method, one after another. At temperature 0 the outputs must be identical; at "
                        "temperature > 0 they must have the same distribution, which one run cannot show.")
            with gr.Row():
                cmp_methods = gr.CheckboxGroup([m for m in METHODS if m != "vanilla"],
                                               value=[m for m in METHODS if m != "vanilla"],
                                               label="methods (vanilla always runs)", elem_id="cmp-methods")
                cmp_temp = gr.Slider(0, 2, value=0, step=0.05, label="temperature", elem_id="cmp-temperature")
                cmp_tokens = gr.Number(value=32, precision=0, label=f"max tokens (1–{COMPARE_TOKENS_LIMIT})",
                                       elem_id="cmp-max-tokens")
            with gr.Row():
                cmp_btn = gr.Button("Run compare", variant="primary", elem_id="compare-btn")
                cmp_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
            cmp_status = gr.Markdown(elem_id="compare-status")
            cmp_table = gr.HTML(elem_id="compare-table")

        with gr.Tab("Export / Replay", id="export") as tab_export:
            with gr.Row():
                export_btn = gr.Button("Export trace, timeline and tables", elem_id="export-btn")
                figures_btn = gr.Button("Export figures (PNG 3×, SVG)", elem_id="figures-btn")
                zip_btn = gr.Button("Download all (zip)", variant="primary", elem_id="zip-btn")
            export_note = gr.Markdown(elem_id="export-note")
            export_files = gr.File(label="Downloads", file_count="multiple", interactive=False, elem_id="export-files")
            gr.Markdown(f"**Replay** — upload a trace JSON (≤ {MAX_UPLOAD_BYTES // (1024 * 1024)} MB), e.g. one "
                        "recorded on a GPU machine; every view then shows it, no model needed.")
            # No file_types filter: the browser would drop another file silently; the app says what it is.
            upload = gr.File(label="Upload a trace (.trace.json)", type="filepath", elem_id="upload")
            replay_status = gr.Markdown(elem_id="replay-status")

        tabs = (tab_generate, tab_kv, tab_acc, tab_overhead, tab_compare, tab_export)
        # -- wiring ------------------------------------------------------------------------------
        kv_inputs = [kv_request, kv_iter, kv_start, kv_width]
        kv_outputs = [kv_overview, kv_zoom, kv_prompt, kv_recall]
        views = [run_select, kv_request, kv_iter, kv_start, *kv_outputs, acc_pos, acc_hist, acc_run, breakdown_plot]
        gen_outputs = [stream, counters, stages]
        refresh = dict(fn=studio.refresh_views, inputs=kv_inputs, outputs=views, api_visibility="private")
        # Pause / Step / Stop run queued (their toasts need the queue) but never wait for the engine's slots.
        control = dict(api_visibility="private", concurrency_limit=None)

        demo.load(studio.status, outputs=[status, timer], queue=False)
        demo.load(studio.overhead, outputs=[overhead_plot, overhead_note, throughput_plot], queue=False)
        timer.tick(studio.status, outputs=[status, timer], queue=False)
        for tab in tabs:
            tab.select(None, js=RESIZE_PLOTS_JS)

        gen_inputs = [prompt, chat, method, gamma, sparsity, min_budget, granularity, record_recall,
                      temperature, top_p, top_k, seed, max_tokens]
        gen = generate_btn.click(studio.generate, gen_inputs, gen_outputs, api_name="generate", **eng)
        prompt.submit(studio.generate, gen_inputs, gen_outputs, api_visibility="private", **eng).then(**refresh)
        gen.then(**refresh)
        stop_btn.click(studio.stop, api_name="stop", concurrency_limit=None)
        pause_btn.click(studio.pause, pause_btn, [pause_btn, *gen_outputs, kv_iter], **control)
        for starts in (generate_btn.click, prompt.submit, upload.upload):   # a new run starts unpaused
            starts(None, None, pause_btn, js=RESET_PAUSE_JS)
        step_btn.click(studio.step, outputs=[pause_btn, *gen_outputs, kv_iter], **control)
        show_rejected.change(None, show_rejected, None, js=TOGGLE_REJECTED_JS)
        model_picker.input(studio.switch_model, model_picker, [status, timer, chat], queue=False,
                           api_name="switch_model")
        run_select.input(studio.select_run, run_select, [pause_btn, *gen_outputs], api_visibility="private") \
            .then(**refresh)

        # preprocess=False: while refresh_views moves a slider's range and value together, a change event can
        # see the old value against the new maximum, which Gradio would refuse; render_kv clamps anyway.
        for ctl in (kv_request, kv_iter, kv_start, kv_width):
            ctl.change(studio.render_kv, kv_inputs, kv_outputs, api_visibility="private", trigger_mode="always_last",
                       preprocess=False)

        cmp_inputs = [prompt, chat, cmp_methods, gamma, sparsity, min_budget, granularity, cmp_temp, cmp_tokens]
        cmp_btn.click(studio.compare, cmp_inputs, [cmp_table, cmp_status], api_name="compare", **eng).then(**refresh)
        cmp_stop.click(studio.stop, api_visibility="private", concurrency_limit=None)

        # The sweep's handler only watches the engine thread (one sweep for the whole app), so it takes no
        # engine slot; every tab that presses Run watches the same sweep.
        sweep_outputs = [sweep_plot, sweep_status]
        demo.load(studio.sweep.show, outputs=sweep_outputs, queue=False)
        tab_overhead.select(studio.sweep.show, outputs=sweep_outputs, queue=False)
        sweep_btn.click(studio.sweep.run, [gamma, sparsity, min_budget, granularity], sweep_outputs,
                        api_visibility="private", concurrency_limit=None)
        sweep_stop.click(studio.sweep.stop, outputs=sweep_status, api_visibility="private", concurrency_limit=None)
        sweep_export.click(studio.sweep.export, outputs=[sweep_files, sweep_status], api_visibility="private",
                           concurrency_id="figures", concurrency_limit=1)

        export_btn.click(studio.export, outputs=[export_files, export_note], api_visibility="private")
        for btn, fn in ((figures_btn, studio.export_figures), (zip_btn, studio.download_all)):
            btn.click(fn, kv_inputs, [export_files, export_note], api_visibility="private",
                      concurrency_id="figures", concurrency_limit=1)
        upload.upload(studio.replay, upload, [replay_status, *gen_outputs, upload], api_visibility="private") \
            .then(**refresh)

        stream_tokens, pool, engine_steps = make_api(studio)
        gr.api(stream_tokens, api_name="stream_tokens", **eng)
        gr.api(pool, api_name="pool", queue=False)
        gr.api(engine_steps, api_name="engine_steps", queue=False)
    studio.blocks = demo
    return demo


def quiet_queue_analytics() -> None:
    """Call before building the Blocks (their queue reads these). After every event Gradio's queue
    rebuilds a pandas table of its last 10,000 events for its /monitoring page, which this app does
    not serve: 2.5-12 ms of the server's interpreter per event, and Arrow buffers that grew the
    server's memory with every request (bench/NOTES.md version 72). A value set in the environment wins."""
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", str(2**62))
    os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "1")


# How often an idle Gradio queue looks for new requests when the engine runs on the CPU (Gradio: 1 ms).
IDLE_POLL_CPU_S = 0.01


def slow_idle_queue_poll(demo: gr.Blocks, engine_on_cpu: bool) -> None:
    """Call after `demo.queue()`. A Gradio queue with nothing to start wakes every millisecond to look
    (`Queue.sleep_when_free`, the whole time the app runs): a tenth of a core, which an engine on
    the CPU's cores feels (6 % of its decode rate at batch 8 on two cores; bench/NOTES.md version 77).
    There a request waits up to 10 ms more to start, against a prefill of hundreds of ms; on a GPU,
    whose host has cores to spare, Gradio's 1 ms stays."""
    if not engine_on_cpu:
        return
    queue = demo._queue
    if not hasattr(queue, "sleep_when_free"):
        print("Vegas Studio: this Gradio's queue has no sleep_when_free; it polls as Gradio sets it", flush=True)
        return
    queue.sleep_when_free = IDLE_POLL_CPU_S


def skip_absent_matplotlib() -> None:
    """Gradio imports matplotlib twice around every call and every streamed message of an event (to
    switch its backend to agg for the call). Where matplotlib is not installed each failed import
    searches sys.path again, and Python keeps no record of a failure: 14 % of the server's busy time
    while streaming here (bench/NOTES.md version 74). Marked absent once, they fail at once, as they would."""
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is None:
        sys.modules["matplotlib"] = None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vegas-studio", description="Vegas Studio")
    p.add_argument("--model", default=None, help="GGUF file, Hugging Face directory or packaged model name "
                   "(qwen2.5-coder-0.5b, gemma-3-270m; default: embedded SmolLM2); the page's picker switches")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda if available")
    p.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--concurrency", type=int, default=8, help="requests streaming at once (one engine batch)")
    p.add_argument("--queue-size", type=int, default=16, help="requests waiting beyond that; more are told busy")
    p.add_argument("--attention", default="auto", choices=["auto", "reference", "triton"],
                   help="auto: Triton kernels on a GPU, PyTorch reference on a CPU; reference: force the reference (debugging)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs: every GPU forward runs eagerly (debugging)")
    p.add_argument("--abandon-after", type=float, default=30.0, metavar="SECONDS",
                   help="stop an API stream whose events no client has read for this long (default: 30)")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                   help="batch-invariant kernels on a GPU (default), so Compare's lossless check is exact in "
                        "bf16; --no-deterministic runs the faster default kernels")
    p.add_argument("--no-model", action="store_true", help="replay uploaded traces only; load no model")
    p.add_argument("--engine-in-process", action="store_true",
                   help="run the engine on a thread of the server's process, not in a process of its own "
                        "(where it shares one interpreter lock with the server: for comparison)")
    p.add_argument("--results-dir", default="bench/results",
                   help="committed benchmark results the Overhead and Throughput views read "
                        "(default: bench/results of the folder the app starts in)")
    args = p.parse_args(argv)

    worker = None
    if args.device == "cuda" and not args.no_model:
        import torch
        if not torch.cuda.is_available():
            print("error: --device cuda was asked for, but no CUDA GPU is available", file=sys.stderr)
            return 2
    if not args.no_model:
        # Room for the throughput sweep's largest batch (the Overhead tab measures it on this engine).
        worker_class = EngineWorker if args.engine_in_process else ProcessWorker
        worker = worker_class(args.model, args.device, args.dtype,
                              max_num_seqs=max(SWEEP_MAX_BATCH, args.concurrency),
                              attention=args.attention, cuda_graphs="off" if args.eager else "auto",
                              deterministic=args.deterministic, warm_up_batch=args.concurrency).start()
        print("Vegas Studio: loading the model in the background (the page shows progress)…", flush=True)
    if not args.abandon_after > 0:
        print(f"error: --abandon-after must be > 0, got {args.abandon_after:g}", file=sys.stderr)
        return 2
    studio = Studio(worker, results_dir=args.results_dir, abandon_after_s=args.abandon_after)
    quiet_queue_analytics()
    skip_absent_matplotlib()
    demo = build_ui(studio, args.concurrency, args.model)
    demo.queue(max_size=args.queue_size, default_concurrency_limit=4)
    slow_idle_queue_poll(demo, engine_on_cpu=not args.no_model and resolve_device(args.device).type == "cpu")
    demo.launch(server_name=args.host, server_port=args.port, max_file_size=MAX_UPLOAD_BYTES,
                footer_links=["api"], css=CSS, theme=THEME, show_error=False, quiet=False,
                enable_monitoring=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

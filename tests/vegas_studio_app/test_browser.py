"""The app in headless Chromium (Debian's /usr/bin/chromium driven by Playwright; no browser download),
against `python app.py` started here with the default model on the CPU.

Screenshots go to screenshots/tmp/ (git-ignored). The README's tour shots (docs/screenshot.png and
docs/tour/*.png, at 1280, 1440 and 1920 px) are copied there when missing or UPDATE_SCREENSHOT=1.
The tests run in file order against one app start and one page, with short generations.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import time
import zipfile
import urllib.error
import urllib.request

import pytest

from tests.vegas_studio_app.conftest import CHROMIUM, CHROMIUM_ARGS, ROOT

SHOTS = ROOT / "screenshots" / "tmp"
PROMPT = "Write a haiku about the sea."
STREAM_TIMEOUT_MS = 240_000

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install -y chromium)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser, app_server):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(app_server.url)
    pg.wait_for_selector("#engine-status:has-text('Ready')", timeout=300_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield pg
    ctx.close()


# -- helpers ---------------------------------------------------------------------------------------
def shot(page, name: str) -> str:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return str(path)


def tour_shot(page, name: str, width: int | None = None):
    """A screenshot for the README's tour, at `width` px (then back to the test viewport)."""
    if width:
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(600)                                    # plots follow the window (responsive)
    # Toasts left by earlier steps of a test are not part of the view being shown: hidden for the shot.
    page.evaluate("""() => { const s = document.createElement('style'); s.id = 'vs-no-toasts';
        s.textContent = '.toast-wrap, .toast-body { visibility: hidden !important; }';
        document.head.appendChild(s); }""")
    path = shot(page, name)
    page.evaluate("() => document.getElementById('vs-no-toasts').remove()")
    docs = ROOT / "docs" / "tour" / f"{name}.png"
    if not docs.exists() or os.environ.get("UPDATE_SCREENSHOT") == "1":
        docs.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, docs)
    if width:
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.wait_for_timeout(300)


def open_tab(page, name: str):
    page.get_by_role("tab", name=name).click()
    page.wait_for_timeout(300)


def set_number(page, elem_id: str, value):
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")


def choose(page, elem_id: str, value: str):
    page.locator(f"#{elem_id} input").first.click()
    page.locator(f"ul[role=listbox] li:visible:has-text('{value}')").first.click()
    page.wait_for_timeout(200)


def status_text(page) -> str:
    return page.evaluate("() => document.querySelector('#counters .vs-status')?.innerText ?? ''")


def wait_done(page, timeout=STREAM_TIMEOUT_MS, before: str | None = None):
    """Until the status says done, stopped or ⚠; with `before` (the status before the click), until
    it also differs from it (a short run can end between two polls, so "not done" may never be seen)."""
    if before is not None:
        page.wait_for_function("(b) => (document.querySelector('#counters .vs-status')?.innerText ?? '').trim() != b",
                               arg=before.strip(), timeout=60_000)
    page.wait_for_function(
        "() => { const s = document.querySelector('#counters .vs-status');"
        " return s && /^(done|stopped|⚠)/.test(s.textContent.trim()); }", timeout=timeout)


def plot_data(page, elem_id: str, until: str = "el.data.length > 0", timeout: int = 60_000):
    """The Plotly traces a gr.Plot drew (read from the plot's DOM node), once `until` holds for the plot
    element `el`. The views refresh in a follow-up event after the run's status says done, so a plot
    read at once may still be the placeholder (a message, no traces) or the previous run's figure."""
    page.wait_for_function(
        f"""() => {{ const el = document.querySelector('#{elem_id} .js-plotly-plot');
        return !!el && !!el.data && ({until}); }}""", timeout=timeout)
    return page.evaluate(
        f"""() => {{ const el = document.querySelector('#{elem_id} .js-plotly-plot');
        return el.data.map(t => ({{name: t.name || null, x: t.x ? Array.from(t.x) : null,
            y: t.y ? Array.from(t.y) : null, z: t.z ? t.z.map(r => Array.from(r)) : null}})); }}""")


def pool(app_server) -> dict:
    return app_server.ready_client.predict(api_name="/pool")


# -- tests (run in file order against one page) ----------------------------------------------------
def test_generate_streams_tokens_with_their_colours(page, app_server):
    page.fill("#prompt textarea", PROMPT)
    choose(page, "method", "vegas")
    set_number(page, "max-tokens", 19)                            # the run: ends inside an iteration
    set_number(page, "gamma", 4)
    before = status_text(page)
    page.click("#generate-btn")
    page.wait_for_selector("#token-stream .vs-tok", timeout=STREAM_TIMEOUT_MS)
    first_count = page.locator("#token-stream .vs-tok:not(.vs-rejected)").count()
    streaming_status = status_text(page)
    wait_done(page, before=before)
    final_count = page.locator("#token-stream .vs-tok:not(.vs-rejected)").count()
    assert status_text(page).startswith("done"), status_text(page)
    # Tokens streamed: the first view came while generating, with fewer tokens than the final one.
    assert streaming_status.startswith("generating") or first_count < final_count, (streaming_status, first_count)
    assert final_count == 19
    kinds = page.eval_on_selector_all("#token-stream .vs-tok", "els => els.map(e => e.dataset.kind)")
    assert kinds[0] == "decode"                                  # the first iteration cannot draft
    assert {"accepted"} <= set(kinds) and ({"correction", "bonus"} & set(kinds))
    colours = page.eval_on_selector_all(
        "#token-stream .vs-tok", "els => els.map(e => [e.dataset.kind, getComputedStyle(e).backgroundColor])")
    expected = {"accepted": "rgb(178, 242, 187)", "correction": "rgb(255, 216, 168)", "bonus": "rgb(165, 216, 255)",
                "decode": "rgb(233, 236, 239)", "rejected": "rgb(255, 201, 201)"}
    for kind, colour in colours:
        assert colour == expected[kind], (kind, colour)
    counters = page.eval_on_selector_all("[data-counter]", "els => Object.fromEntries(els.map(e => [e.dataset.counter, e.textContent]))")
    assert counters["tokens"] == "19" and float(counters["tokens_per_s"]) > 0
    assert float(counters["mean_acceptance_length"]) >= 1.0 and int(counters["iterations"]) >= 2
    # Rejected drafts are in the page but hidden until asked for.
    rejected = page.locator("#token-stream .vs-rejected")
    if rejected.count():
        assert not rejected.first.is_visible()
        page.locator("#show-rejected input").check()
        assert rejected.first.is_visible()
        assert "line-through" in rejected.first.evaluate("e => getComputedStyle(e).textDecorationLine")
        page.locator("#show-rejected input").uncheck()
    # The step panel shows the last iteration: the tokens it says were emitted are the ones in the stream.
    last = int(page.get_attribute("#stages .vs-stages", "data-iteration"))
    assert last == int(counters["iterations"])                   # one numbering: counter and panel
    in_stream = page.locator(f"#token-stream .vs-tok:not(.vs-rejected)[data-iter='{last}']").count()
    accept = page.inner_text("#stages [data-stage='accept']")
    assert f"{in_stream} token(s) emitted" in accept, (in_stream, accept)
    path = shot(page, "generate")
    docs = ROOT / "docs" / "screenshot.png"
    if not docs.exists() or os.environ.get("UPDATE_SCREENSHOT") == "1":
        docs.parent.mkdir(exist_ok=True)
        shutil.copyfile(path, docs)


def test_kv_heatmap_and_acceptance_plots_render_with_data(page):
    open_tab(page, "KV selection")
    overview = plot_data(page, "kv-overview")
    assert overview and overview[0]["z"] is not None
    z = overview[0]["z"]
    assert len(z) == 30                                          # SmolLM2's 30 layers
    assert any(0 < v < 1 or v == 1 for row in z for v in row)     # something was selected
    zoom = plot_data(page, "kv-zoom")
    assert {v for row in zoom[0]["z"] for v in row} >= {1, 2}      # selected and recent entries
    # Hover text is the token: the zoom's customdata holds the context's token texts.
    texts = page.evaluate("() => document.querySelector('#kv-zoom .js-plotly-plot').data[0].customdata[0]")
    assert any(t.strip() for t in texts)
    assert page.locator("#kv-prompt .vs-ps[data-layers]").count() > 10
    shot(page, "kv-selection")
    open_tab(page, "Acceptance")
    pos = plot_data(page, "acc-position")
    assert len(pos[0]["y"]) == 4 and all(0 <= v <= 1 for v in pos[0]["y"])
    hist = plot_data(page, "acc-hist")
    assert abs(sum(hist[0]["y"]) - 1.0) < 1e-6
    run = plot_data(page, "acc-running")
    assert run[0]["y"][-1] >= 1.0
    shot(page, "acceptance")
    open_tab(page, "Overhead")
    page.wait_for_selector("#overhead-note:has-text('kernel')")
    assert plot_data(page, "breakdown-plot")[0]["name"] == "draft"
    shot(page, "overhead")


def test_step_through_a_finished_run(page):
    open_tab(page, "Generate")
    page.click("#step-btn")
    page.wait_for_selector("#stages .vs-stages[data-iteration='1']")
    page.click("#step-btn")
    page.wait_for_selector("#stages .vs-stages[data-iteration='2']")
    stages = page.eval_on_selector_all("#stages [data-stage]", "els => els.map(e => e.dataset.stage)")
    assert stages == ["draft", "verify", "accept", "select"]
    shown = page.locator("#token-stream .vs-tok:not(.vs-rejected)").count()
    assert 1 < shown < 19                                        # only the first two iterations
    assert "paused at iteration 2 of" in status_text(page) and counter(page, "iterations") == 2
    assert page.inner_text("#pause-btn").strip() == "Resume"
    page.click("#pause-btn")                                     # resume: the whole run again
    page.wait_for_function("() => document.querySelectorAll('#token-stream .vs-tok:not(.vs-rejected)').length == 19")
    shot(page, "step-through")


def counter(page, name: str) -> int:
    return int(page.inner_text(f"#counters [data-counter='{name}']"))


def test_pause_holds_the_engine_and_step_runs_one_iteration(page):
    open_tab(page, "Generate")
    choose(page, "method", "vegas")
    set_number(page, "max-tokens", 40)
    page.click("#generate-btn")
    # This run's first iteration (not the previous run's view, which is still on the page).
    page.wait_for_function("() => { const c = document.querySelector(\"#counters [data-counter='iterations']\");"
                           " const s = document.querySelector('#counters .vs-status');"
                           " return c && +c.textContent >= 1 && s.textContent.startsWith('generating'); }",
                           timeout=STREAM_TIMEOUT_MS)
    page.click("#pause-btn")
    page.wait_for_selector("#counters .vs-status:has-text('the engine holds this request')")
    page.wait_for_function("() => document.querySelector('#pause-btn').textContent.trim() == 'Resume'")
    n = counter(page, "iterations")
    page.wait_for_timeout(1500)                                  # held: the engine runs no iteration
    assert counter(page, "iterations") == n and "paused" in status_text(page)
    page.click("#step-btn")
    page.wait_for_selector(f"#stages .vs-stages[data-iteration='{n + 1}']", timeout=60_000)
    assert counter(page, "iterations") == n + 1                  # the counter and the panel agree
    stages = page.eval_on_selector_all("#stages [data-stage]", "els => els.map(e => e.dataset.stage)")
    assert stages == ["draft", "verify", "accept", "select"]
    # Live, as it happens: Select shows which layers kept what (a strip row per layer), Accept the rule.
    select = page.locator("#stages [data-stage='select']")
    assert "Collect-2-Query" in select.inner_text() and "not recorded yet" not in select.inner_text()
    assert select.locator(".vs-strip g[data-layer]").count() == 30
    assert "Rule (temperature 0)" in page.inner_text("#stages [data-stage='accept']")
    tour_shot(page, "step-through-live", 1440)
    page.wait_for_timeout(1500)                                  # exactly one iteration, then held again
    assert counter(page, "iterations") == n + 1 and "paused" in status_text(page)
    page.click("#pause-btn")                                     # Resume: runs on to the end
    wait_done(page)
    assert status_text(page).startswith("done"), status_text(page)        # 40 tokens, or an earlier EOS
    assert counter(page, "iterations") > n + 1 and counter(page, "tokens") <= 40
    assert page.inner_text("#pause-btn").strip() == "Pause"
    page.click("#step-btn")                                      # the recorded run, from its first iteration
    page.wait_for_selector("#stages .vs-stages[data-iteration='1']")
    assert page.inner_text("#pause-btn").strip() == "Resume"    # the next Generate resets it


def test_change_method(page):
    choose(page, "method", "stream")
    set_number(page, "max-tokens", 12)
    before = status_text(page)
    page.click("#generate-btn")
    page.wait_for_function("() => document.querySelector('#pause-btn').textContent.trim() == 'Pause'")
    wait_done(page, before=before)
    assert status_text(page).startswith("done")
    assert page.locator("#token-stream .vs-tok:not(.vs-rejected)").count() == 12
    open_tab(page, "KV selection")
    page.wait_for_function("() => { const p = document.querySelector('#kv-overview .js-plotly-plot');"
                           " return p && p.layout.title.text.includes('(stream)'); }", timeout=30_000)
    open_tab(page, "Generate")


def test_bad_input_shows_a_message(page):
    page.fill("#prompt textarea", "   ")
    page.click("#generate-btn")
    page.wait_for_selector("#counters .vs-status:has-text('prompt is empty')")
    page.fill("#prompt textarea", PROMPT)


def test_compare_verdict_waits_for_every_method_then_passes(page):
    open_tab(page, "Compare")
    for m in ("quest", "specextend", "vegas-all"):
        page.locator(f"#cmp-methods label:has-text('{m}') input").uncheck()
    set_number(page, "cmp-max-tokens", 12)
    page.click("#compare-btn")
    # After vanilla, before the others: no verdict yet.
    page.wait_for_selector("#compare-table [data-lossless='pending']", timeout=STREAM_TIMEOUT_MS)
    assert "passed" not in page.inner_text("#compare-table")
    page.wait_for_selector("#compare-status:has-text('done')", timeout=STREAM_TIMEOUT_MS * 2)
    assert page.get_attribute("#compare-table .vs-compare", "data-lossless") == "pass", page.inner_text("#compare-table")
    methods = page.eval_on_selector_all("#compare-table tr[data-method]", "els => els.map(e => e.dataset.method)")
    assert methods == ["vanilla", "stream", "vegas"]
    assert "Lossless check passed" in page.inner_text("#compare-table")
    speedup = page.eval_on_selector_all("#compare-table td[data-col='speedup']", "els => els.map(e => e.textContent)")
    ratio = page.eval_on_selector_all("#compare-table td[data-col='iteration-ratio']", "els => els.map(e => e.textContent)")
    assert speedup[0] == "1.00×" and ratio[0] == "1.00×" and all(float(x[:-1]) > 0 for x in speedup + ratio)
    tour_shot(page, "compare", 1440)
    open_tab(page, "Acceptance")
    names = [t["name"] for t in plot_data(page, "acc-position",
                                          until="el.data.some(t => t.name === 'vegas (compare 1)')")]
    assert "stream (compare 1)" in names and "vegas (compare 1)" in names


def test_sampled_compare_says_what_lossless_means(page):
    open_tab(page, "Compare")
    page.locator("#cmp-methods label:has-text('stream') input").uncheck()
    set_number(page, "cmp-max-tokens", 6)
    set_number(page, "cmp-temperature", 0.8)
    page.click("#compare-btn")
    page.wait_for_selector("#compare-status:has-text('done: compare 2')", timeout=STREAM_TIMEOUT_MS * 2)
    table = page.inner_text("#compare-table")
    assert page.get_attribute("#compare-table .vs-compare", "data-lossless") == "n/a"
    assert "same distribution, not identical text" in table and "test_sampled_lossless.py" in table
    identical = "✔ identical" in table
    assert identical or page.locator("#compare-table .vs-diff[data-method='vegas'] ins, "
                                     "#compare-table .vs-diff[data-method='vegas'] del").count() > 0
    set_number(page, "cmp-temperature", 0)


def run_options(page) -> list[str]:
    page.locator("#run-select input").first.click()
    options = page.locator("ul[role=listbox] li:visible").all_inner_texts()
    page.locator("#run-select input").first.click()                # closed again
    page.wait_for_timeout(200)
    return options


def test_run_selector_is_shared_by_every_tab(page):
    options = run_options(page)
    assert any("Generate · vegas" in o for o in options) and any("compare 1 · vegas" in o for o in options)
    choose(page, "run-select", "compare 1 · vegas")
    open_tab(page, "KV selection")
    page.wait_for_function("() => (document.querySelector('#kv-overview .js-plotly-plot')?.layout.title.text"
                           " || '').includes('(vegas)')", timeout=60_000)
    # A typed zoom width applies, and the window stays inside the run.
    set_number(page, "kv-width", 16)
    page.wait_for_function("() => { const m = document.querySelector('#kv-zoom .js-plotly-plot')?.layout.meta;"
                           " return m && m.stop - m.start == 16; }", timeout=60_000)
    assert page.locator(".toast-body:has-text('greater than maximum')").count() == 0    # ranges move with the run
    tour_shot(page, "kv-selection", 1280)
    open_tab(page, "Generate")
    assert "showing run #" in status_text(page)
    choose(page, "run-select", "Generate · stream")               # back to the stream run for the exports
    page.wait_for_function("() => (document.querySelector('#counters .vs-status')?.textContent ?? '').includes('showing run')"
                           " && document.querySelectorAll('#token-stream .vs-tok:not(.vs-rejected)').length == 12")


# Plot width against its panel; legend, title and annotations inside the plot's SVG.
FIT_JS = """(id) => {
  const el = document.querySelector('#' + id + ' .js-plotly-plot');
  const panel = document.querySelector('#' + id).getBoundingClientRect();
  const svg = el.querySelector('.main-svg').getBoundingClientRect();
  const inside = (r) => r.width === 0 || (r.left >= svg.left - 1 && r.right <= svg.right + 1 && r.top >= svg.top - 1
                                          && r.bottom <= svg.bottom + 1);
  const parts = Array.from(el.querySelectorAll('.legend, .annotation, .gtitle, .gtitle-subtitle'));
  const sub = el.querySelector('.gtitle-subtitle');
  // The subtitle ends above the plot area and above any bar label drawn outside it.
  const subBottom = sub ? sub.getBoundingClientRect().bottom : -1e9;
  const below = Array.from(el.querySelectorAll('.nsewdrag, .bartext')).map(e => e.getBoundingClientRect())
                     .filter(r => r.width > 0);
  return {plot: svg.width, panel: panel.width, clipped: parts.some(p => !inside(p.getBoundingClientRect())),
          subtitleOverlaps: below.some(r => r.top < subBottom - 1),
          empty: !!(el.layout.meta && el.layout.meta.empty), provenance: (el.layout.meta || {}).provenance || '',
          subtitlePx: sub ? parseFloat(getComputedStyle(sub).fontSize) : 0};
}"""


def test_figures_fit_their_panel_and_name_settings_and_source(page):
    for width in (1280, 1440, 1920):
        page.set_viewport_size({"width": width, "height": 1000})
        for tab, ids in (("KV selection", ["kv-overview", "kv-zoom"]), ("Acceptance", ["acc-position", "acc-hist"]),
                         ("Overhead", ["overhead-plot", "throughput-plot", "breakdown-plot"])):
            open_tab(page, tab)
            page.wait_for_timeout(400)
            for elem_id in ids:
                fit = page.evaluate(FIT_JS, elem_id)
                assert fit["plot"] >= 0.95 * fit["panel"], (width, elem_id, fit)       # not 700 px in a wide panel
                assert not fit["clipped"], (width, elem_id, fit)
                assert not fit["subtitleOverlaps"], (width, elem_id, fit)
                if not fit["empty"]:
                    assert fit["subtitlePx"] >= 12 and fit["provenance"], (width, elem_id, fit)
                    live = fit["provenance"].startswith("measured live on cpu")
                    assert live or fit["provenance"].startswith("from bench/results/"), fit
                    assert live == (elem_id not in ("overhead-plot", "throughput-plot")), fit
    page.set_viewport_size({"width": 1400, "height": 1000})
    open_tab(page, "Acceptance")
    tour_shot(page, "acceptance", 1920)
    open_tab(page, "Overhead")
    tour_shot(page, "overhead", 1440)


def test_export_trace_and_reimport_it(page, tmp_path):
    open_tab(page, "Export / Replay")
    page.click("#export-btn")
    page.wait_for_selector("#export-files a[download$='.trace.json']", timeout=60_000)
    names = page.eval_on_selector_all("#export-files a[download]", "els => els.map(e => e.getAttribute('download'))")
    stem = next(n for n in names if n.endswith("-generate-stream.trace.json"))[:-len(".trace.json")]
    for ext in (".perfetto.json", ".iterations.parquet", ".iterations.csv"):
        assert stem + ext in names, names
    assert any(n.endswith("-compare-vegas.trace.json") for n in names), names     # same prompt: exported too
    with page.expect_download() as dl:
        page.click(f"#export-files a[download='{stem}.trace.json']")
    saved = tmp_path / "exported.trace.json"
    dl.value.save_as(saved)
    data = json.loads(saved.read_text())
    assert data["schema_version"] == 1 and data["config"]["method"] == "stream"
    req = data["requests"][0]
    assert [t for it in req["iterations"] for t in it["emitted"]] == req["output_token_ids"]
    page.set_input_files("#upload input[type=file]", str(saved))
    page.wait_for_selector("#replay-status:has-text('Replaying')", timeout=60_000)
    assert "method stream" in page.inner_text("#replay-status")
    open_tab(page, "Generate")
    assert page.locator("#token-stream .vs-tok:not(.vs-rejected)").count() == len(req["output_token_ids"])
    open_tab(page, "KV selection")
    replayed = plot_data(page, "kv-overview", until="(el.layout.title?.text || '').includes('(stream)') && el.data.length > 0")
    assert len(replayed[0]["z"]) == 30
    meta = page.evaluate("() => document.querySelector('#kv-overview .js-plotly-plot').layout.meta")
    assert meta["provenance"].startswith("from exported.trace.json, "), meta
    shot(page, "replay")


def test_export_figures(page):
    open_tab(page, "Export / Replay")
    page.click("#figures-btn")
    page.wait_for_selector("#export-note:has-text('Exported')", timeout=180_000)
    note = page.inner_text("#export-note")
    names = page.eval_on_selector_all("#export-files a[download]", "els => els.map(e => e.getAttribute('download'))")
    # kaleido with Debian's chromium writes PNG (3x) and SVG; without them the app falls back to HTML and says so.
    assert "(kaleido; PNG 1200 px wide at 3×)" in note, note
    assert "kv-selection-overview.png" in names and "kv-selection-overview.svg" in names, names
    assert "per-position-acceptance.png" in names


def test_download_all_zip_holds_traces_tables_and_figures_at_3x(page, tmp_path):
    open_tab(page, "Export / Replay")
    page.click("#zip-btn")
    page.wait_for_selector("#export-note:has-text('One zip')", timeout=240_000)
    note = page.inner_text("#export-note")
    assert "(kaleido; PNG 1200 px wide at 3×)" in note, note
    with page.expect_download() as dl:
        page.click("#export-files a[download$='.zip']")
    path = tmp_path / "all.zip"
    dl.value.save_as(path)
    z = zipfile.ZipFile(path)
    names = z.namelist()
    assert any(n.endswith(".trace.json") for n in names) and any(n.endswith(".iterations.csv") for n in names)
    assert "figures/kv-selection-overview.png" in names and "figures/kv-selection-overview.svg" in names
    png = z.read("figures/per-position-acceptance.png")
    assert struct.unpack(">II", png[16:24])[0] == 3600                     # 1200 px at 3x
    tour_shot(page, "export", 1280)


def test_wrong_input_gets_visible_feedback(browser, app_server, tmp_path):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})     # a fresh session: nothing loaded
    pg = ctx.new_page()
    pg.goto(app_server.url)
    pg.wait_for_selector("#engine-status:has-text('Ready')", timeout=60_000)
    for button, words in (("#step-btn", "Nothing to step"), ("#pause-btn", "Nothing to pause")):
        pg.click(button)
        pg.wait_for_selector(f".toast-body:has-text('{words}')", timeout=30_000)
        pg.wait_for_selector(f"#counters .vs-status:has-text('{words}')")
    assert "paused at iteration 0" not in pg.inner_text("#counters")
    set_number(pg, "max-tokens", 100000)
    pg.click("#generate-btn")
    pg.wait_for_selector(".toast-body:has-text('between 1 and 1024')", timeout=30_000)
    assert pg.input_value("#max-tokens input[type=number]") == "100000"  # shown as typed, and refused
    open_tab(pg, "Export / Replay")
    png = tmp_path / "figure.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    pg.set_input_files("#upload input[type=file]", str(png))
    pg.wait_for_selector("#replay-status:has-text('is a PNG image, not a trace')", timeout=60_000)
    perfetto = tmp_path / "run.perfetto.json"
    perfetto.write_text(json.dumps({"traceEvents": [], "displayTimeUnit": "ms"}))
    pg.set_input_files("#upload input[type=file]", str(perfetto))
    pg.wait_for_selector("#replay-status:has-text('Perfetto / Chrome timeline')", timeout=60_000)
    pg.click("#zip-btn")
    pg.wait_for_selector("#export-note:has-text('nothing to download yet')", timeout=30_000)
    ctx.close()


def test_corrupt_upload_shows_a_message(page, tmp_path):
    open_tab(page, "Export / Replay")
    bad = tmp_path / "corrupt.json"
    bad.write_text('{"schema_version": 1, "model": [[[')
    page.set_input_files("#upload input[type=file]", str(bad))
    page.wait_for_selector("#replay-status:has-text('Could not load this trace')", timeout=60_000)
    wrong = tmp_path / "wrong-schema.json"
    wrong.write_text(json.dumps({"schema_version": 99, "hello": "world"}))
    page.set_input_files("#upload input[type=file]", str(wrong))
    page.wait_for_selector("#replay-status:has-text('schema_version')", timeout=60_000)
    shot(page, "corrupt-upload")


def test_stop_mid_stream_frees_the_kv_pages(page, app_server):
    open_tab(page, "Generate")
    choose(page, "method", "vanilla")
    set_number(page, "max-tokens", 400)
    page.click("#generate-btn")
    page.wait_for_function(
        "() => (document.querySelector('#counters .vs-status')?.textContent ?? '').startsWith('generating')"
        " && document.querySelectorAll('#token-stream .vs-tok').length >= 3", timeout=STREAM_TIMEOUT_MS)
    page.click("#stop-btn")
    page.wait_for_selector("#counters .vs-status:has-text('stopped')", timeout=60_000)
    n = page.locator("#token-stream .vs-tok").count()
    assert 3 <= n < 400
    deadline = time.monotonic() + 30
    while (p := pool(app_server))["active_requests"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert p["num_free"] == p["num_blocks"] and p["active_requests"] == 0, p
    shot(page, "stopped")


def test_server_serves_only_its_own_files(app_server):
    for path in ("gradio_api/file=app.py", "gradio_api/file=/etc/passwd", f"gradio_api/file={ROOT}/app.py"):
        try:
            with urllib.request.urlopen(app_server.url + path, timeout=10) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        assert status in (403, 404), (path, status)

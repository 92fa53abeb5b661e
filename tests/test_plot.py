"""A picture of the run: a real run's report carries its timeline, and `ggbatch plot` draws it,
every panel with data (checked in the PNG's pixels, panel by panel)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from helpers import ggbatch as cli
from helpers import write_questions

pytestmark = pytest.mark.timeout(240)

N = 192  # questions of TOKENS tokens, 2 slots a worker: about 10 s on the demo model with 2 workers
TOKENS = 512  # a CPU sample needs an interval: the plot's CPU panel has a line, not one dot a worker

LINE_COLOURS = {"k": (0, 0, 0), "C0": (31, 119, 180), "C1": (255, 127, 14)}  # matplotlib's defaults


def ggbatch(*args, timeout=200, **kwargs):
    return cli(*args, timeout=timeout, **kwargs)


def colour_pixels(image, box, rgb, tolerance=40):
    """Pixels of about colour `rgb` inside `box` (left, top, right, bottom) of a PIL image."""
    import numpy as np

    region = np.asarray(image.crop(box).convert("RGB"), dtype=np.int16)
    return int((np.abs(region - np.array(rgb, dtype=np.int16)) <= tolerance).all(axis=2).sum())


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, demo_model):
    """Several seconds of the demo model with the report (its timeline samples every second or
    so: the plot needs a few), 2 workers where there are 2 cores."""
    tmp = tmp_path_factory.mktemp("plot")
    questions = write_questions(tmp / "q.jsonl", N)
    workers = 2 if len(os.sched_getaffinity(0)) >= 2 else 1
    report = tmp / "r.json"
    r = ggbatch("run", "--model", demo_model, "--input", questions, "--output", tmp / "a.json", "--report", report,
                "--max-tokens", TOKENS, "--ignore-eos", "--workers", workers, "--slots", 2)
    assert r.returncode == 0, r.stderr
    return report, json.loads(report.read_text()), workers


@pytest.mark.model
def test_the_report_holds_a_timeline_whose_totals_are_the_runs(real_run):
    _, rep, workers = real_run
    timeline = rep["timeline"]
    assert len(timeline) >= 3
    times = [s["t_s"] for s in timeline]
    assert times == sorted(times) and times[-1] <= rep["timings_s"]["total_s"] + 0.5
    done = [s["done"] for s in timeline]
    assert done == sorted(done) and done[-1] == N
    end = timeline[-1]
    assert set(end["workers"]) == {str(w) for w in range(workers)}
    # The engines' counters are whole at the end: every generated token, and every prompt token
    # decoded, as the report's prompt_tokens_computed counts them (the shared prefix once per
    # worker; the timeline left it out, and said 9 fewer a worker)
    assert end["generated_tokens"] == rep["tokens"]["generated"] == N * TOKENS
    assert end["prompt_tokens"] == rep["prefix_cache"]["prompt_tokens_computed"]
    for w in end["workers"].values():
        assert w["pss_mib"] > 0 and w["threads"] >= 1


@pytest.mark.model
def test_plot_draws_every_panel_with_data(real_run, tmp_path):
    from PIL import Image

    from ggbatch.runner.tools import plot

    report_path, rep, workers = real_run
    png = tmp_path / "run.png"
    r = ggbatch("plot", report_path, "-o", png)
    assert r.returncode == 0, r.stderr
    image = Image.open(png)
    assert image.size == (int(plot.FIGSIZE[0] * plot.DPI), int(plot.FIGSIZE[1] * plot.DPI))
    fig = plot.draw(rep)  # the same figure, for where its panels are
    fig.canvas.draw()
    height = image.size[1]
    for ax, (_, title, per_worker) in zip(fig.axes, plot.PANELS):
        assert ax.get_title() == title
        box = ax.get_window_extent()
        inner = (int(box.x0) + 3, int(height - box.y1) + 3, int(box.x1) - 3, int(height - box.y0) - 3)
        colours = [f"C{w}" for w in range(workers)] if per_worker else ["k"]
        assert len(ax.get_lines()) == len(colours), title
        for line in ax.get_lines():
            assert len(line.get_xdata()) >= 1, (title, line.get_label())
        # Workers' lines may lie on each other (the same PSS): the panel's pixels show at least one.
        # A series of one or two samples (PSS is measured every 5 s) is only a marker or two.
        assert sum(colour_pixels(image, inner, LINE_COLOURS[c]) for c in colours) >= 4, title


def test_plot_without_a_timeline_is_one_line_exit_2(tmp_path):
    report = tmp_path / "old.json"
    report.write_text(json.dumps({"layout": {}, "questions": {}}))
    r = ggbatch("plot", report, "-o", tmp_path / "x.png")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"ggbatch: error: {report}: no timeline in this report (written by "
                                             "`ggbatch run --report` of an older ggbatch, or not a run report)"]
    assert not (tmp_path / "x.png").exists()


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; from ggbatch.runner.cli import main; "
            f"sys.exit(main(['plot', {str(tmp_path / 'r.json')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == "ggbatch: error: ggbatch plot needs matplotlib: pip install 'ggbatch[plot]'"


SMALL_REPORT = {  # what plot reads of a run's report, as a one-worker run writes it
    "model": {"path": "/models/s260.gguf"}, "layout": {"workers": 1, "threads_per_worker": 2, "slots_per_worker": 3},
    "questions": {"answered": 3, "failed": 0}, "timings_s": {"total_s": 1.6},
    "timeline": [{"t_s": 1.32, "done": 0, "generated_per_s": None, "workers": {}},
                 {"t_s": 1.56, "done": 3, "generated_per_s": 199.3, "busy_slots": 3.0,
                  "workers": {"0": {"generated_per_s": 199.3, "busy_slots": 3.0, "pss_mib": 43.0}}}]}


def test_plot_writes_the_file_it_names_and_refuses_a_format_matplotlib_lacks(tmp_path):
    report = tmp_path / "r.json"
    report.write_text(json.dumps(SMALL_REPORT))
    r = ggbatch("plot", report, "-o", tmp_path / "noext")
    assert r.returncode == 0 and r.stdout == f"plot: {tmp_path / 'noext'}\n", r.stderr
    assert (tmp_path / "noext").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "noext.png").exists()
    r = ggbatch("plot", report, "-o", tmp_path / "x.jpgg")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"ggbatch: error: {tmp_path / 'x.jpgg'}: matplotlib cannot write .jpgg files; "
                               "give one of ") and ".png, " in r.stderr and ".pdf, " in r.stderr
    assert not (tmp_path / "x.jpgg").exists()


@pytest.mark.parametrize("edit, said", [
    (lambda r: r.update(model="s260.gguf"), "model must be an object, not 's260.gguf'"),
    (lambda r: r["timings_s"].update(total_s=None), "timings_s.total_s must be a number, not null"),
    (lambda r: r["timeline"][1].update(workers={"w0": {"done": 1}}),
     "timeline[1].workers: 'w0' is not a worker's number"),
    (lambda r: r["timeline"][1].pop("t_s"), "timeline[1].t_s must be a number, not missing"),
    (lambda r: r["layout"].update(slots_per_worker="3"), "layout.slots_per_worker must be a whole number, not '3'"),
])
def test_plot_of_a_hand_edited_report_names_the_report_and_the_key(tmp_path, edit, said):
    edited = json.loads(json.dumps(SMALL_REPORT))
    edit(edited)
    report = tmp_path / "r.json"
    report.write_text(json.dumps(edited))
    r = ggbatch("plot", report, "-o", tmp_path / "x.png")
    assert r.returncode == 2 and not (tmp_path / "x.png").exists()
    assert r.stderr.splitlines() == [f"ggbatch: error: {report}: {said}" + (
        ": is the report hand-edited?" if "must be" in said else "")]


def test_plot_to_a_format_matplotlib_lists_but_cannot_write_here_is_one_line_and_keeps_the_old_file(tmp_path):
    """.pgf needs a TeX (xelatex) on PATH: without one it is refused in one line, exit 2, and the
    file already there is left as it was, with no half-written copy beside it."""
    report = tmp_path / "r.json"
    report.write_text(json.dumps(SMALL_REPORT))
    out = tmp_path / "run.pgf"
    out.write_text("the old plot\n")
    no_tex = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # the venv's bin: python, no TeX
    r = ggbatch("plot", report, "-o", out, env=no_tex)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(
        f"ggbatch: error: {out}: matplotlib cannot write .pgf files here: 'xelatex' not found"), r.stderr
    assert out.read_text() == "the old plot\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "run.pgf"]

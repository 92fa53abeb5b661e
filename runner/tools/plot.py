"""`ggbatch plot REPORT.json -o run.png`: a picture of a run from its report's `timeline`
(runner/watch/timeline.py): six panels over the job's time, one line per worker where the timeline has
one: questions done, generated tokens/s, prompt tokens/s, busy slots (% of the worker's slots),
CPU (100% = one core) and PSS. Needs matplotlib (ggbatch[plot]).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import ConfigError, quote
from ..files.outputs import write_atomic
from ..words import layout_words

# (key in a timeline sample, panel title, whether each worker has its own line)
PANELS = (("done", "questions done", False),
          ("generated_per_s", "generated tokens/s", True),
          ("prompt_per_s", "prompt tokens/s", True),
          ("occupancy", "busy slots, % of the worker's slots", True),
          ("cpu_percent", "CPU % (100 = one core)", True),
          ("pss_mib", "PSS MiB", True))
MISSING = object()  # a key absent from the report, told apart from null
PLOT = "the plot"  # what the output file is, in check_writable's and write_atomic's errors
FIGSIZE = (12.0, 8.0)  # inches
DPI = 100


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("ggbatch plot needs matplotlib: pip install 'ggbatch[plot]'") from None


def read_report(path: str) -> dict[str, Any]:
    """A report with a timeline, or ConfigError naming the file and what is wrong with it."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: report not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the report: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not a JSON report ({exc.msg})") from None
    if not isinstance(report, dict) or not isinstance(report.get("timeline"), list):
        raise ConfigError(f"{path}: no timeline in this report (written by `ggbatch run --report` "
                          "of an older ggbatch, or not a run report)")
    check_what_is_drawn(path, report)
    if not any(s.get("workers") for s in report["timeline"]):
        raise ConfigError(f"{path}: the timeline has no sample of a worker (no question was answered in "
                          "this run: all from the journal, or none to answer): nothing to draw")
    return report


def check_what_is_drawn(path: str, report: dict[str, Any]) -> None:
    """ConfigError naming the report and the key for a value of the wrong type among those the
    plot reads (a report edited by hand): the one place that vouches for draw's and _title's reads."""
    for key in ("model", "layout", "questions", "timings_s"):
        _expect(path, key, report.get(key), dict, "an object")
    _expect(path, "model.path", report.get("model", {}).get("path"), str, "a text")
    # absent is drawn as 0 s; null is not a time
    _expect(path, "timings_s.total_s", report.get("timings_s", {}).get("total_s", 0), (int, float), "a number",
            optional=False)
    slots = report.get("layout", {}).get("slots_per_worker")
    _expect(path, "layout.slots_per_worker", slots, int, "a whole number")
    for i, sample in enumerate(report["timeline"]):
        _check_sample(path, f"timeline[{i}]", sample)


def _check_sample(path: str, where: str, sample: Any) -> None:
    _expect(path, where, sample, dict, "an object", optional=False)
    _expect(path, f"{where}.t_s", sample.get("t_s", MISSING), (int, float), "a number", optional=False)
    _expect(path, f"{where}.workers", sample.get("workers"), dict, "an object")
    rows = [(where, sample)]
    for worker, row in sample.get("workers", {}).items():
        if not worker.isdigit():
            raise ConfigError(f"{path}: {where}.workers: {quote(worker)} is not a worker's number")
        _expect(path, f"{where}.workers.{worker}", row, dict, "an object", optional=False)
        rows.append((f"{where}.workers.{worker}", row))
    for name, row in rows:
        for key in ("busy_slots", *(panel for panel, _, _ in PANELS)):
            _expect(path, f"{name}.{key}", row.get(key), (int, float), "a number")


def _expect(path: str, key: str, value: Any, kind: type | tuple[type, ...], what: str,
            optional: bool = True) -> None:
    """ConfigError unless `value` is of `kind` (None passes where the key may be absent or null;
    MISSING is an absent key); a bool is not a number here, though Python counts it as an int."""
    if (value is None and optional) or (isinstance(value, kind) and not isinstance(value, bool)):
        return
    shown = "missing" if value is MISSING else quote(value)
    raise ConfigError(f"{path}: {key} must be {what}, not {shown}: is the report hand-edited?")


def image_format(path: str) -> str:
    """The format the plot is saved in, from the file's extension (none: png, and the file keeps the
    name given: matplotlib would add .png); ConfigError listing matplotlib's own for one it cannot write."""
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(path).suffix[1:].lower() or "png"
    known = FigureCanvasBase.get_supported_filetypes()
    if fmt not in known:
        raise ConfigError(f"{path}: matplotlib cannot write .{fmt} files; give one of "
                          f"{', '.join('.' + ext for ext in sorted(known))}")
    return fmt


def workers_of(timeline: Sequence[dict[str, Any]]) -> list[str]:
    """Every worker id the timeline names, in order."""
    return sorted({w for s in timeline for w in s.get("workers", {})}, key=int)


def series(timeline: Sequence[dict[str, Any]], key: str, worker: Optional[str],
           slots: int = 1) -> tuple[list[float], list[float]]:
    """(times, values) of one panel's line: the run's (`worker` None) or one worker's; samples
    without a value (a rate before the second sample, no step in an interval) are left out."""
    xs, ys = [], []
    for sample in timeline:
        row = sample if worker is None else sample.get("workers", {}).get(worker)
        if row is None:
            continue
        value = row.get("busy_slots") if key == "occupancy" else row.get(key)
        if value is None:
            continue
        xs.append(sample["t_s"])
        ys.append(100.0 * value / max(1, slots) if key == "occupancy" else value)
    return xs, ys


def draw(report: dict[str, Any]) -> Any:
    """The figure (matplotlib's, Agg backend); the caller saves or inspects it."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    timeline, layout = report["timeline"], report.get("layout", {})
    workers = workers_of(timeline)
    fig, axes = plt.subplots(3, 2, figsize=FIGSIZE, sharex=True)
    for ax, (key, title, per_worker) in zip(axes.flat, PANELS):
        lines = [(w, f"C{i}", f"worker {w}") for i, w in enumerate(workers)] if per_worker else [(None, "k", "run")]
        for worker, colour, label in lines:
            xs, ys = series(timeline, key, worker, layout.get("slots_per_worker", 1))
            ax.plot(xs, ys, color=colour, marker="." if len(xs) < 30 else None, label=label)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    for ax in axes[-1]:
        ax.set_xlabel("seconds since the job started")
    fig.suptitle(_title(report), fontsize=11, y=0.985)
    # The legend outside the panels: each panel's own pixels are its data and axes alone.
    handles, labels = axes.flat[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=max(1, len(labels)), bbox_to_anchor=(0.5, 0.955),
               frameon=False)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.07, top=0.87, hspace=0.3, wspace=0.18)
    return fig


def _title(report: dict[str, Any]) -> str:
    lay, q, t = report.get("layout", {}), report.get("questions", {}), report.get("timings_s", {})
    model = Path(report.get("model", {}).get("path", "?")).name
    n = lay.get("workers", "?")
    threads, slots = lay.get("threads_per_worker", "?"), lay.get("slots_per_worker", "?")
    known = all(isinstance(v, int) for v in (n, threads, slots))  # a report cut short lacks some
    shape = layout_words(n, threads, slots) if known else f"{n} workers × {threads} threads × {slots} slots"
    return (f"{model}: {shape}; {q.get('answered', '?')} answered, "
            f"{q.get('failed', 0)} failed in {t.get('total_s', 0):.1f} s")


def save(report: dict[str, Any], path: str) -> None:
    """The run's plot, written to `path` (write_figure)."""
    image_format(path)  # before drawing: a format matplotlib does not know is refused at once
    write_figure(draw(report), path, PLOT, DPI)


def write_figure(fig: Any, path: str, role: str, dpi: int) -> None:
    """A matplotlib figure drawn in memory, in the format `path`'s extension names, then written
    whole beside `path` and renamed; the figure is closed. A format matplotlib lists but cannot
    write here (.pgf without its TeX) is one line and leaves no file. `role`: what the file is to
    the command, for the error."""
    import matplotlib.pyplot as plt

    try:
        picture = _drawn(fig, path, dpi)
    finally:
        plt.close(fig)
    write_atomic(path, picture, role)


def check_writable_format(path: str) -> None:
    """ConfigError, as write_figure gives it, unless matplotlib can write `path`'s format here: a
    figure of one character is drawn in memory (an empty one would not show that .pgf's TeX is
    missing: TeX is started to measure text), so a command that draws after its work refuses first."""
    from matplotlib.figure import Figure

    probe = Figure(figsize=(0.2, 0.2))
    probe.text(0, 0, "x")
    _drawn(probe, path, 10)


def _drawn(fig: Any, path: str, dpi: int) -> bytes:
    fmt = image_format(path)
    picture = io.BytesIO()
    try:
        fig.savefig(picture, dpi=dpi, format=fmt)
    except (RuntimeError, OSError, ValueError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"{path}: matplotlib cannot write .{fmt} files here: {why}") from None
    return picture.getvalue()

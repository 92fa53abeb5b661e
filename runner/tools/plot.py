"""`ggbatch plot REPORT.json -o run.png`: a picture of a run from its report's `timeline`
(runner/watch/timeline.py): six panels over the job's time, one line per worker where the timeline has
one: questions done, generated tokens/s, prompt tokens/s, busy slots (% of the worker's slots),
CPU (100% = one core) and PSS. Needs matplotlib (ggbatch[plot]).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import ConfigError

# (key in a timeline sample, panel title, whether each worker has its own line)
PANELS = (("done", "questions done", False),
          ("generated_per_s", "generated tokens/s", True),
          ("prompt_per_s", "prompt tokens/s", True),
          ("occupancy", "busy slots, % of the worker's slots", True),
          ("cpu_percent", "CPU % (100 = one core)", True),
          ("pss_mib", "PSS MiB", True))
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
    if not any(s.get("workers") for s in report["timeline"] if isinstance(s, dict)):
        raise ConfigError(f"{path}: the timeline has no sample of a worker (no question was answered in "
                          "this run: all from the journal, or none to answer): nothing to draw")
    return report


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
    return (f"{model}: {n} {'worker' if n == 1 else 'workers'} × {lay.get('threads_per_worker', '?')} threads × "
            f"{lay.get('slots_per_worker', '?')} slots; {q.get('answered', '?')} answered, "
            f"{q.get('failed', 0)} failed in {t.get('total_s', 0):.1f} s")


def save(report: dict[str, Any], path: str) -> None:
    import matplotlib.pyplot as plt

    fig = draw(report)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)

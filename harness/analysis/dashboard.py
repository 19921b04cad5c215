"""The comparison dashboard: one self-contained HTML page per suite, answering what people ask every
morning: what is red (the latest matrix as a heatmap), since when (each cell's accuracy over the last
runs), what changed (latest versus previous, paired on shared questions), and what the red cells
share (the failure attribution), with links into the MLflow UI.

It reads runs through an archive (`harness.results.archive`): the local results folder and, on CI
runners that start clean, the MLflow tracking store. Runs carry their MLflow ids, so every cell
links to its run in the UI.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from harness.analysis.compare import compare_runs
from harness.errors import ConfigError
from harness.records import CellResult, Status
from harness.results.archive import Archives, LoadedRun, find_run
from harness.results.reporting import diverged_text

STATUS_CODE = {Status.PASS: 0, Status.INCONCLUSIVE: 1, Status.ERROR: 2, Status.MISMATCH: 3, Status.FAIL: 4,
               Status.SKIPPED: -1}
COLOURS = [[0.0, "#d9d9d9"], [0.166, "#d9d9d9"], [0.167, "#2ca02c"], [0.333, "#2ca02c"], [0.334, "#17becf"],
           [0.5, "#17becf"], [0.501, "#ffbf00"], [0.666, "#ffbf00"], [0.667, "#9467bd"], [0.833, "#9467bd"],
           [0.834, "#d62728"], [1.0, "#d62728"]]


@dataclass(frozen=True)
class DashboardInput:
    suite: str
    runs: list[LoadedRun]  # oldest first; the last is the latest
    mlflow_ui: str | None = None


def load_input(archive: Archives, suite: str, history: int = 14, mlflow_ui: str | None = None) -> DashboardInput:
    infos = archive.runs(suite)[-history:]
    if not infos:
        raise ConfigError(f"no finished run of suite {suite!r} in the results folder or the tracking store; "
                          "run `regress run` first, or pass --tracking-uri")
    return DashboardInput(suite, [find_run(archive, info.run_id) for info in infos], mlflow_ui)


def _run_link(data: DashboardInput, run: LoadedRun, run_id: str | None, label: str) -> str:
    if not data.mlflow_ui or not run_id or not run.info.mlflow_experiment_id:
        return html.escape(label)
    url = f"{data.mlflow_ui.rstrip('/')}/#/experiments/{run.info.mlflow_experiment_id}/runs/{run_id}"
    return f'<a href="{html.escape(url)}">{html.escape(label)}</a>'


def heatmap_figure(run: LoadedRun):
    """Rows: model and the first half of the axes; columns: the other axes; colour: verdict."""
    import plotly.graph_objects as go

    cells = [c for c in run.cells.values()]
    axes = list(cells[0].factors) if cells else []
    split = (len(axes) + 1) // 2
    row_axes, column_axes = axes[:split], axes[split:]

    def label(cell: CellResult, names: list[str], with_model: bool) -> str:
        parts = ([cell.model] if with_model else []) + [f"{n}={cell.factors[n]}" for n in names]
        return " · ".join(parts) or "-"

    rows = sorted({label(c, row_axes, True) for c in cells})
    columns = sorted({label(c, column_axes, False) for c in cells})
    z = [[None] * len(columns) for _ in rows]
    text = [[""] * len(columns) for _ in rows]
    hover = [[""] * len(columns) for _ in rows]
    for cell in cells:
        i, j = rows.index(label(cell, row_axes, True)), columns.index(label(cell, column_axes, False))
        z[i][j] = STATUS_CODE[cell.status]
        text[i][j] = "-" if cell.accuracy is None else f"{cell.accuracy:.2f}"
        hover[i][j] = f"{cell.cell_id}<br>{cell.status.value}<br>{html.escape(cell.reason[:160])}"
    figure = go.Figure(go.Heatmap(z=z, x=columns, y=rows, text=text, texttemplate="%{text}", customdata=hover,
                                  hovertemplate="%{customdata}<extra></extra>", colorscale=COLOURS, zmin=-1, zmax=4,
                                  showscale=False, xgap=2, ygap=2))
    figure.update_layout(title=f"{run.info.run_id}: verdict by cell (number: accuracy)", height=120 + 40 * len(rows),
                         margin={"l": 20, "r": 20, "t": 60, "b": 20}, yaxis={"autorange": "reversed"})
    return figure


def history_figure(data: DashboardInput):
    import plotly.graph_objects as go

    figure = go.Figure()
    latest = data.runs[-1]
    for cell_id in sorted(latest.cells):
        xs, ys = [], []
        for run in data.runs:
            cell = run.cells.get(cell_id)
            if cell is not None and cell.accuracy is not None:
                xs.append(run.info.started_at.replace("T", " ")[:16])
                ys.append(cell.accuracy)
        failing = latest.cells[cell_id].status.is_regression
        figure.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=cell_id,
                                    line={"width": 3 if failing else 1}, opacity=1.0 if failing else 0.5))
    # One tick per run (a time axis would tick in fractions of a millisecond for a single run).
    figure.update_layout(title=f"accuracy of each cell over the last {len(data.runs)} runs (bold: failing now)",
                         height=420, yaxis={"range": [0, 1], "title": "accuracy"}, margin={"t": 60},
                         xaxis={"type": "category", "title": "run started (UTC)"})
    return figure


def reasons_table(data: DashboardInput) -> str:
    """Every cell of the latest run that did not pass, with its whole reason and its MLflow run."""
    latest = data.runs[-1]
    rows = []
    for cell in sorted(latest.cells.values(), key=lambda c: (c.status is Status.INCONCLUSIVE, c.cell_id)):
        if cell.status in (Status.PASS, Status.SKIPPED):
            continue
        link = _run_link(data, latest, cell.mlflow_run_id, cell.cell_id)
        rows.append(f'<tr class="{cell.status.value}"><td>{cell.status.value}</td><td>{link}</td>'
                    f"<td>{html.escape(cell.reason)}</td></tr>")
    if not rows:
        return "<p>Every cell passed.</p>"
    return ('<table id="reasons"><thead><tr><th>verdict</th><th>cell</th><th>why</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def diff_table(data: DashboardInput) -> str:
    if len(data.runs) < 2:
        return "<p>Only one run so far: nothing to compare with.</p>"
    before, after = data.runs[-2], data.runs[-1]
    try:
        changes = compare_runs(before, after)
    except ConfigError as error:
        return f"<p>{html.escape(str(error))}</p>"
    rows = []
    for change in sorted(changes, key=lambda c: (c.change.rank, c.cell_id)):
        def acc(result: CellResult | None) -> str:
            return "-" if result is None or result.accuracy is None else f"{result.accuracy:.3f}"

        diff = "-" if change.difference is None else f"{change.difference:+.3f} ({change.shared})"
        p_value = "-" if change.p_value is None else f"{change.p_value:.2g}"
        link = _run_link(data, after, change.after.mlflow_run_id if change.after else None, change.cell_id)
        rows.append(f'<tr class="{change.change.css_class}"><td>{change.change}</td><td>{link}</td>'
                    f"<td>{acc(change.before)}</td><td>{acc(change.after)}</td><td>{diff}</td><td>{p_value}</td>"
                    f"<td>{html.escape(diverged_text(change.after))}</td></tr>")
    runs = (f"<p>{_run_link(data, before, before.info.mlflow_run_id, before.info.run_id)} → "
            f"{_run_link(data, after, after.info.mlflow_run_id, after.info.run_id)}</p>")
    return (runs + '<table id="diff"><thead><tr><th>change</th><th>cell</th><th>before</th><th>after</th>'
            "<th>difference (shared questions)</th><th>McNemar p</th>"
            "<th>diverged from reference (questions beyond, mean nats/token)</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
h1 {{ margin-bottom: 4px; }} .meta {{ color: #666; margin-bottom: 16px; }}
.attribution {{ background: #fff4f4; border-left: 4px solid #d62728; padding: 8px 12px; margin: 12px 0; }}
table {{ border-collapse: collapse; font-size: 13px; }} td, th {{ border-bottom: 1px solid #ddd; padding: 4px 8px; }}
tr.newly-failing td, tr.fail td, tr.mismatch td {{ background: #fde0e0; }} tr.fixed td {{ background: #e0f5e0; }}
#reasons td:last-child {{ white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }}
.legend span {{ display: inline-block; padding: 2px 8px; margin-right: 6px; color: white; border-radius: 3px; }}
</style></head><body>
<h1>{title}</h1>
<div class="meta">latest run {latest} · {counts} · protocol {protocol}</div>
<div class="legend"><span style="background:#2ca02c">pass</span><span style="background:#d62728">fail</span>
<span style="background:#9467bd">mismatch</span><span style="background:#ffbf00">error</span>
<span style="background:#17becf">inconclusive</span><span style="background:#999">skipped</span></div>
{attribution}
<h2>What is red</h2><div id="heatmap">{heatmap}</div>
<h3>Why</h3>{reasons}
<h2>What changed since the previous run</h2>{diff}
<h2>Since when</h2>{history}
</body></html>
"""


def build_html(data: DashboardInput) -> str:
    latest = data.runs[-1]
    info = latest.info
    counts = ", ".join(f"{n} {status}" for status, n in info.counts.items())
    attribution = (f'<div class="attribution"><b>The failing cells share:</b> <code>{html.escape(info.attribution)}'
                   "</code></div>") if info.attribution else ""
    return PAGE.format(
        title=html.escape(f"{data.suite}: accuracy regression matrix"),
        latest=_run_link(data, latest, info.mlflow_run_id, info.run_id), counts=html.escape(counts),
        protocol=html.escape(f"{info.protocol} {info.protocol_fingerprint}"), attribution=attribution,
        heatmap=heatmap_figure(latest).to_html(full_html=False, include_plotlyjs=True, div_id="heatmap-plot"),
        diff=diff_table(data), reasons=reasons_table(data),
        history=('<div id="history">' + history_figure(data).to_html(full_html=False, include_plotlyjs=False,
                                                                     div_id="history-plot") + "</div>")
        if len(data.runs) > 1 else "<p>Only one run so far: each cell's history starts here.</p>")


def log_on_latest_run(archive: Archives, suite: str, page: Path, tracking_uri: str) -> str:
    """Attach the built page to the suite's latest parent run in MLflow; what happened, in words."""
    from harness.results.tracking import Tracker

    latest = archive.runs(suite)[-1]
    if not latest.mlflow_run_id:
        return f"not logged: run {latest.run_id} has no MLflow run (`regress sync {latest.run_id}` uploads it)"
    tracker = Tracker(tracking_uri)
    tracker.start(latest, {})
    tracker.log_artifact_text(latest.mlflow_run_id, page.read_text(), "dashboard.html")
    return f"logged as dashboard.html on MLflow run {latest.mlflow_run_id}" + (
        f" (failed: {tracker.error})" if tracker.error else "")

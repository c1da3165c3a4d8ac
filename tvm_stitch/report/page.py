"""The report as one self-contained HTML page: no network, every script inlined.

The graph is an SVG laid out here (layers by topological depth, nodes of a layer in the
model's order); the charts are plotly figures, drawn by plotly.js inlined once in the page.
A small script ahead of everything else records script errors, failed promises and
``console.error`` calls into ``#page-errors``, so a headless browser's DOM shows them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from ..inspect_model import FlowReport, Inspection, total_rows
from .mapping import Mapping, NodeMapping, NodePlace
from .measured import Measured

NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 168, 36, 18, 30, 12
FIXED_COLOURS = {NodePlace.COMPUTE: "#9aa5b1", NodePlace.FALLBACK: "#f28e2b",
                 NodePlace.NO_KERNEL: "#ffffff", NodePlace.NOT_MAPPED: "#d3d3d3"}
FLOW_COLOURS = {"stitch": "#1f77b4", "baseline": "#d62728"}

ERROR_CAPTURE = """
window.__pageErrors = [];
function __recordError(text) {
  window.__pageErrors.push(String(text));
  var box = document.getElementById('page-errors');
  if (box) { box.textContent = window.__pageErrors.join('\\n'); }
}
window.addEventListener('error', function (e) { __recordError('error: ' + e.message); });
window.addEventListener('unhandledrejection', function (e) {
  __recordError('unhandled rejection: ' + e.reason); });
(function () { var original = console.error;
  console.error = function () { __recordError('console.error: ' +
    Array.prototype.join.call(arguments, ' ')); original.apply(console, arguments); }; })();
document.addEventListener('DOMContentLoaded', function () {
  var box = document.getElementById('page-errors');
  if (box) { box.textContent = window.__pageErrors.join('\\n'); } });
"""

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
#page-errors { color: #b00; }
.legend span { display: inline-block; padding: 2px 8px; margin: 2px; border: 1px solid #888; }
.note { color: #555; font-size: 0.9em; }
#graph-box { overflow: auto; max-height: 900px; border: 1px solid #ddd; }
"""


def group_colour(group: int) -> str:
    """A distinct colour per stitched group: hues a golden angle apart, kept from red to
    yellow, which the fallbacks' orange holds."""
    return f"hsl({90 + (group * 137.508) % 240:.0f}, 60%, 62%)"


def node_colour(node: NodeMapping) -> str:
    """The fill of a node of the graph: its group's colour, or its place's."""
    if node.place is NodePlace.STITCHED and node.main is not None:
        return group_colour(node.main.index)
    return FIXED_COLOURS[node.place]


def render_page(inspection: Inspection, mapping: Mapping, measured: Measured | None) -> str:
    """The whole report page for ``inspection`` (both flows, stitch first), the stitch flow's
    node mapping and, when given, the measured times of the workload."""
    flows = {f.flow: f for f in inspection.flows}
    sections = [
        f"<h1>tvm-stitch report: {html.escape(inspection.model)}</h1>",
        f"<p>Target {html.escape(str(inspection.target.attrs.get('arch')))}; estimates for "
        f"the {html.escape(inspection.gpu.name)} by the roofline model of "
        "<code>tvm_stitch.analysis</code>"
        + (", counted at " + html.escape(", ".join(f"{d}={s}" for d, s in
                                                    inspection.dims.items()))
           if inspection.dims else "") + ".</p>",
        '<pre id="page-errors"></pre>',
        _summary(inspection, measured),
        _graph_section(mapping, flows.get("stitch")),
        "<h2>Per kernel</h2>",
        '<p class="note">Kernels in launch order, for each flow: global bytes accessed and '
        "the estimated time" + (" (measured results hold no per-kernel times)"
                                if measured is not None else "") + ".</p>",
        _figure(_kernel_figure(inspection), "kernel-chart"),
        "<h2>Roofline</h2>",
        '<p class="note">Each kernel at its DRAM bytes and the bandwidth its estimate implies '
        "(DRAM bytes / estimated time), under the GPU's peak DRAM bandwidth; the model counts "
        "memory traffic only, so compute kernels are placed by their bytes too.</p>",
        _figure(_roofline_figure(inspection), "roofline"),
    ]
    if measured is not None:
        sections.append(_measured_section(measured))
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>tvm-stitch report: {html.escape(inspection.model)}</title>"
            f"<script>{ERROR_CAPTURE}</script><style>{STYLE}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>\n"
            + "\n".join(sections) + "\n</body></html>\n")


def _summary(inspection: Inspection, measured: Measured | None) -> str:
    gpu = inspection.gpu.name
    totals = {f.flow: f.totals() for f in inspection.flows}
    rows = total_rows(gpu)
    head = "".join(f"<th>{html.escape(f)}</th>" for f in totals)
    body = "".join(f"<tr><td>{label}</td>" + "".join(f"<td>{cell(t)}</td>"
                                                   for t in totals.values()) + "</tr>"
                   for label, cell in rows)
    if measured is not None and measured.times_us:
        body += "<tr><td>measured us</td>" + "".join(
            f"<td>{measured.times_us[f]:.1f}</td>" if f in measured.times_us else
            f"<td>{html.escape(measured.statuses.get(f, 'not measured'))}</td>"
            for f in totals) + "</tr>"
    lines = []
    if {"stitch", "baseline"} <= totals.keys():
        est = {f: totals[f]["estimated_us"][gpu] for f in ("stitch", "baseline")}
        lines.append(f"estimated speed-up of stitch over baseline on the {gpu}: "
                     f"<b id=\"estimated-speedup\">{est['baseline'] / est['stitch']:.2f}x</b>")
        if measured is not None and {"stitch", "baseline"} <= measured.times_us.keys():
            t = measured.times_us
            lines.append(f"measured speed-up: <b id=\"measured-speedup\">"
                         f"{t['baseline'] / t['stitch']:.2f}x</b>")
    return (f'<div id="summary"><h2>Summary</h2><table><tr><th></th>{head}</tr>{body}</table>'
            + "".join(f"<p>{line}</p>" for line in lines) + "</div>")


def _graph_section(mapping: Mapping, stitch: FlowReport | None) -> str:
    counts = {p: sum(n.place is p for n in mapping.nodes) for p in NodePlace}
    kernels = {} if stitch is None else {g.id: g.function for g in stitch.plan.groups}
    legend = [f'<span style="background:{group_colour(g)}">group {g}: {html.escape(f)}</span>'
              for g, f in sorted(kernels.items())]
    legend += [f'<span style="background:{FIXED_COLOURS[p]}">{_PLACE_WORDS[p]} '
               f"({counts[p]})</span>" for p in FIXED_COLOURS]
    unmatched = ("" if not mapping.unmatched_ops else
                 f'<p class="note">Plan ops no node accounts for: '
                 f"{html.escape(', '.join(mapping.unmatched_ops))}</p>")
    mapped = len(mapping.nodes) - counts[NodePlace.NOT_MAPPED]
    return ('<div id="graph-section"><h2>Graph: each ONNX node by the stitch flow\'s kernel'
            f'</h2><p class="note">{mapped} of {len(mapping.nodes)} nodes mapped '
            f"({100 * mapping.mapped_fraction:.0f}%) through the bindings TVM's importer "
            "made for them; hover over a node for its bindings and, for a fallback, the "
            f'reason.</p><div class="legend">{"".join(legend)}</div>{unmatched}'
            f'<div id="graph-box">{graph_svg(mapping.nodes)}</div></div>')


_PLACE_WORDS = {NodePlace.STITCHED: "stitched group",
                NodePlace.COMPUTE: "TVM's matmul/convolution kernel",
                NodePlace.FALLBACK: "fallback to TVM's fusion",
                NodePlace.NO_KERNEL: "no kernel (folded or not a kernel)",
                NodePlace.NOT_MAPPED: "not mapped"}


def layers(nodes: Sequence[NodeMapping]) -> list[list[int]]:
    """The nodes' positions grouped by topological depth (graph inputs at depth 0)."""
    producer = {out: i for i, n in enumerate(nodes) for out in n.outputs if out}
    depth: list[int] = []
    for n in nodes:  # ONNX nodes are topologically sorted
        depth.append(1 + max((depth[producer[x]] for x in n.inputs if x in producer),
                             default=-1))
    result: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    for i, d in enumerate(depth):
        result[d].append(i)
    return result


def graph_svg(nodes: Sequence[NodeMapping]) -> str:
    """The graph as SVG: a box per node, filled by where it went, an edge per tensor."""
    rows = layers(nodes)
    widest = max((len(r) for r in rows), default=1)
    width = 2 * MARGIN + widest * (NODE_W + GAP_X)
    height = 2 * MARGIN + len(rows) * (NODE_H + GAP_Y)
    at: dict[int, tuple[float, float]] = {}
    for r, row in enumerate(rows):
        left = MARGIN + (widest - len(row)) * (NODE_W + GAP_X) / 2
        for c, i in enumerate(row):
            at[i] = (left + c * (NODE_W + GAP_X), MARGIN + r * (NODE_H + GAP_Y))
    producer = {out: i for i, n in enumerate(nodes) for out in n.outputs if out}
    edges = []
    for i, n in enumerate(nodes):
        for x in n.inputs:
            if x in producer:
                (x0, y0), (x1, y1) = at[producer[x]], at[i]
                a, b = (x0 + NODE_W / 2, y0 + NODE_H), (x1 + NODE_W / 2, y1)
                mid = (a[1] + b[1]) / 2
                edges.append(f'<path d="M{a[0]:.0f},{a[1]:.0f} C{a[0]:.0f},{mid:.0f} '
                             f'{b[0]:.0f},{mid:.0f} {b[0]:.0f},{b[1]:.0f}" fill="none" '
                             'stroke="#999" stroke-width="1"/>')
    boxes = []
    for i, n in enumerate(nodes):
        x, y = at[i]
        where = _PLACE_WORDS[n.place] if n.main is None else n.main.label
        tip = [f"{n.name} ({n.op_type})", f"went into: {where}"]
        if n.main is not None and n.main.reason:
            tip.append(f"reason: {n.main.reason}")
        if len(n.places) > 1:
            tip.append("its bindings are in: " + ", ".join(p.label for p in n.places))
        if n.bindings:
            tip.append("bindings: " + ", ".join(n.bindings))
        if n.note:
            tip.append(n.note)
        dash = ' stroke-dasharray="4 2"' if n.place is NodePlace.NOT_MAPPED else ""
        label = n.op_type if len(n.op_type) <= 20 else n.op_type[:19] + "…"
        boxes.append(
            f'<g class="node" data-place="{n.place.value}"><title>'
            f'{html.escape(chr(10).join(tip))}</title><rect x="{x:.0f}" y="{y:.0f}" '
            f'width="{NODE_W}" height="{NODE_H}" rx="5" fill="{node_colour(n)}" '
            f'stroke="#555"{dash}/><text x="{x + NODE_W / 2:.0f}" y="{y + 15:.0f}" '
            f'text-anchor="middle" font-size="12">{html.escape(label)}</text>'
            f'<text x="{x + NODE_W / 2:.0f}" y="{y + 29:.0f}" text-anchor="middle" '
            f'font-size="10" fill="#333">{html.escape(where)}</text></g>')
    return (f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
            f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">'
            + "".join(edges) + "".join(boxes) + "</svg>")


def _figure(figure: go.Figure, div_id: str) -> str:
    return figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                          config={"displaylogo": False})


def _kernel_figure(inspection: Inspection) -> go.Figure:
    gpu = inspection.gpu.name
    fig = make_subplots(rows=2, cols=1, shared_xaxes=False, vertical_spacing=0.15,
                        subplot_titles=("global bytes accessed", f"estimated {gpu} us"))
    for flow in inspection.flows:
        x = [f"{i}" for i in range(len(flow.kernels))]
        text = [f"{k.name} ({k.kind.value})" for k in flow.kernels]
        colour = FLOW_COLOURS.get(flow.flow)
        fig.add_trace(go.Bar(x=x, y=[k.accessed_bytes for k in flow.kernels], name=flow.flow,
                             hovertext=text, marker_color=colour, legendgroup=flow.flow),
                      row=1, col=1)
        fig.add_trace(go.Bar(x=x, y=[k.estimated_us for k in flow.kernels], name=flow.flow,
                             hovertext=text, marker_color=colour, legendgroup=flow.flow,
                             showlegend=False), row=2, col=1)
    fig.update_layout(barmode="group", height=620, margin={"t": 40})
    fig.update_xaxes(title_text="kernel in launch order", row=2, col=1)
    return fig


def _roofline_figure(inspection: Inspection) -> go.Figure:
    gpu = inspection.gpu
    fig = go.Figure()
    dram = [k.dram_bytes for f in inspection.flows for k in f.kernels if k.dram_bytes > 0]
    lo, hi = (min(dram, default=1), max(dram, default=1))
    xs = [lo / 2 * (4 * hi / lo) ** (i / 40) for i in range(41)]
    peak = gpu.bandwidth / 1e9
    fig.add_trace(go.Scatter(x=xs, y=[peak] * len(xs), mode="lines", name="peak DRAM bandwidth",
                             line={"color": "#444"}))
    fig.add_trace(go.Scatter(x=xs, y=[x / 1e3 / gpu.launch_overhead_us for x in xs],
                             mode="lines", name="launch overhead bound",
                             line={"color": "#999", "dash": "dash"}))
    for flow in inspection.flows:
        ks = [k for k in flow.kernels if k.dram_bytes > 0 and k.estimated_us > 0]
        fig.add_trace(go.Scatter(
            x=[k.dram_bytes for k in ks], y=[k.dram_bytes / 1e3 / k.estimated_us for k in ks],
            mode="markers", name=flow.flow, text=[f"{k.name} ({k.kind.value})" for k in ks],
            marker={"color": FLOW_COLOURS.get(flow.flow), "size": 9}))
    top = math.log10(peak * 2)
    fig.update_xaxes(type="log", title_text="DRAM bytes per kernel")
    fig.update_yaxes(type="log", title_text="GB/s (DRAM bytes / estimated time)",
                     range=[top - 5, top])
    fig.update_layout(height=480, margin={"t": 30})
    return fig


def _measured_section(measured: Measured) -> str:
    head = (f'<div id="measured"><h2>Measured</h2><p class="note">From '
            f"{html.escape(measured.source)} ({html.escape(measured.machine)}, "
            f"{html.escape(measured.date)}): the workload's time per call for each column; "
            "the results hold no per-kernel times, so only these totals are shown.</p>")
    if not measured.times_us:
        return head + f"<p>No measured times: {html.escape(measured.missing)}.</p></div>"
    fig = go.Figure(go.Bar(x=list(measured.times_us), y=list(measured.times_us.values()),
                           marker_color=[FLOW_COLOURS.get(k, "#888") for k in
                                         measured.times_us]))
    fig.update_layout(height=380, margin={"t": 30}, yaxis_title="measured us per call")
    return head + _figure(fig, "measured-chart") + "</div>"


__all__ = ["graph_svg", "group_colour", "layers", "node_colour", "render_page"]

"""``capscore report``: one self-contained HTML page from the outputs of score, probe, correlate, train, explain.

The page needs nothing at view time: plots are PNGs inlined as ``data:`` URIs (drawn
with matplotlib's object API, imported lazily, never pyplot's global state), the CSS
is inline and there is no JavaScript; a Content-Security-Policy forbids any network
request, script or frame, so even a mistake here could not run user text as code.
Every string that comes from a file (captions, system and model names, ids, paths,
errors, titles) goes through :func:`esc` (``html.escape``) — never inserted raw.

Run types are recognised from the files present (:mod:`capscore.report.runs`, docs/report.md).

Each section is one small function ``section_*(runs) -> str`` reading the parsed runs.
"""
from __future__ import annotations

import base64
import html
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
import importlib.util
import sys

from capscore._optional import require
from capscore._table import format_p
from capscore.errors import param_error
from capscore.report.rows import DEFAULT_LIMITS, Limits
from capscore.report.runs import CorrelateRun, ProbeRun, Runs, discover, finite, headline

MAX_SYSTEMS_PLOTTED = 12
MAX_SCATTER_PANELS = 9
MAX_TRAINING_PANELS = 16  # training quantities plotted, one panel each
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


def esc(value: object) -> str:
    """HTML-escape any value as text (quotes included, so it is safe in attributes too)."""
    return html.escape(str(value), quote=True)


# ====================================================================================== HTML pieces
def fmt(x, digits: int = 4) -> str:
    """A number for a table cell; missing or non-finite values are an en dash."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    v = finite(x)
    if v is None:
        return "–" if x is None or isinstance(x, (float, int)) else esc(x)
    return f"{v:.{digits}f}"


def table(head: Sequence[str], rows: Iterable[Sequence], *, cls: str = "") -> str:
    """An HTML table; every cell is escaped (numbers through :func:`fmt`)."""
    def cell(v):
        return fmt(v) if isinstance(v, (int, float)) or v is None else esc(v)

    h = "".join(f"<th>{esc(c)}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>\n" for r in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{h}</tr></thead><tbody>\n{b}</tbody></table>'


def _label(s: object, limit: int = 40) -> str:
    """User text for a matplotlib label: ``$`` escaped (no mathtext), shortened."""
    s = str(s)
    s = s if len(s) <= limit else s[: limit - 1] + "…"
    return s.replace("$", r"\$")


def plots_available() -> bool:
    """Whether matplotlib (the ``report`` extra) is installed; without it the page has its tables only."""
    if "matplotlib" in sys.modules:  # imported, or blocked (None: the way to hide a package from Python)
        return sys.modules["matplotlib"] is not None
    return importlib.util.find_spec("matplotlib") is not None


NO_PLOTS = ("plots need matplotlib, which is not installed (pip install 'capscore[report]'); this page shows "
            "the tables only")


def figure(width: float, height: float):
    Figure = require("matplotlib.figure", purpose="capscore report").Figure  # lazy: only report and explain plot

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def plottable(values: Iterable[float]) -> bool:
    """Whether matplotlib can lay out an axis over ``values``: their span (and its margins) must fit a 64-bit
    float, which it does not for values near ±1e308."""
    vals = list(values)
    return not vals or math.isfinite((max(vals) - min(vals)) * 1.1)


def whole_numbers(axis) -> None:
    """Ticks at whole numbers only, on an axis of counts or steps (no "2.5 captions")."""
    axis.set_major_locator(require("matplotlib.ticker", purpose="capscore report").MaxNLocator(integer=True))


def legend_outside(ax) -> None:
    """The legend to the right of the plot, never over its lines (constrained layout makes room)."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def img(fig, alt: str) -> str:
    """The figure as an inline PNG ``<img>``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _png(data: bytes, alt: str) -> str:
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'


def _note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def _src(*paths: Path | None) -> str:
    return '<p class="src">from ' + ", ".join(f"<code>{esc(p)}</code>" for p in paths if p is not None) + "</p>"


# ====================================================================================== sections
PART_NAMES = {"image_score": "image part", "ref_score": "reference part", "coarse": "coarse", "fine_p": "fine P",
              "fine_r": "fine R", "fine_f": "fine F", "ref_coarse": "ref coarse", "ref_fine_f": "ref fine F"}


def section_scores(runs: Runs) -> str:
    """Score distributions: one per (model, metric, system) — a table, histograms and box plots, extremes."""
    parts = []
    for r in runs.scores:
        s = r.summary
        status = s.get("status") if r.summary_path else None
        what = (f"{r.kind}; {r.n_rows} rows" + (f"; status {status}" if status is not None else "")
                + (f"; engine {s.get('engine')}" if s.get("engine") else ""))
        parts.append(f"<h3>{esc(r.name)}</h3><p>{esc(what)}</p>")
        if r.summary_path is None:
            parts.append(_note("no summary beside these rows: model and metric are the rows' own"))
        elif status != "complete":
            parts.append(_note("this run had not finished when the report was made; its rows so far are shown"))
        if not r.rows_paths:
            parts.append(_note("no scored rows (the rows file is missing)"))
        for b in r.blocks.values():
            parts.append(_score_block(b, headline(s, b.model, b.metric) if r.summary_path else None))
        if isinstance(s.get("system_tests"), list) and s["system_tests"]:
            parts.append(_system_tests(s["system_tests"]))
        if r.n_errors:
            parts.append(f"<p>{esc(r.n_errors)} rows without a score; first:</p>"
                         + table(["row", "id", "error"], r.errors, cls="text"))
        parts.append(_src(r.summary_path, *r.rows_paths[:5])
                     + (_note(f"and {len(r.rows_paths) - 5} more row files") if len(r.rows_paths) > 5 else ""))
    return "".join(parts)


def _score_block(b, head: dict | None = None) -> str:
    """One (model, metric): per system the headline its summary records (``head``: the metric's aggregate,
    e.g. corpus BLEU; shown first, and marked on the histogram), then the distribution of the per-caption
    scores."""
    import numpy as np  # noqa: PLC0415  (deferred: numpy)

    out = [f"<h4>{esc(b.title)} — {b.n_scored} scored"
           + (f", {b.n_unscored} without a score" if b.n_unscored else "") + "</h4>"]
    if not b.systems:
        return out[0] + _note("no scored rows")
    extra = b.parts
    heads = {k: finite(v) for k, v in head["systems"].items()} if head else {}
    stats_rows = []
    with np.errstate(over="ignore", invalid="ignore"):  # scores near ±1e308: an overflow shows as "–", noted
        for system, d in sorted(b.systems.items()):
            x = np.frombuffer(d.scores, dtype=np.float64)
            stats_rows.append([system or "(none)"] + ([heads.get(system)] if head else [])
                              + [len(x), float(x.mean()), float(np.median(x)), float(x.std()), float(x.min()),
                                 float(x.max())]
                              + [d.parts[c][0] / d.parts[c][1] if c in d.parts else None for c in extra])
    per = head.get("per_caption") if head else None
    if head:
        out.append(f"<p>headline: <b>{esc(head.get('name'))}</b> (what the summary records and papers print)"
                   + (f"; the per-caption scores below are {esc(per)}" if per else "") + "</p>")
    out.append(table(["system"] + ([f"headline {head.get('name')}"] if head else [])
                     + ["n", "mean", "median", "std", "min", "max"]
                     + [f"mean {PART_NAMES.get(c, c)}" for c in extra], stats_rows))
    if any(isinstance(v, float) and not math.isfinite(v) for r in stats_rows for v in r):
        out.append(_note("some statistics overflow 64-bit floats on these scores (values near ±1e308) and are "
                         "shown as –"))
    out.append(_score_plot(b, heads))
    ex = [("lowest", *x) for x in b.lowest] + [("highest", *x) for x in b.highest]
    out.append("<details><summary>lowest and highest scored captions</summary>"
               + table(["", "score", "system", "id", "caption"], ex, cls="text") + "</details>")
    return "".join(out)


def _score_plot(b, heads: dict | None = None) -> str:
    scores = {k: d.scores for k, d in b.systems.items()}
    systems = sorted(scores, key=lambda k: -len(scores[k]))[:MAX_SYSTEMS_PLOTTED]
    lo = min(min(scores[s]) for s in systems)
    hi = max(max(scores[s]) for s in systems)
    if not plottable((lo, hi)):  # the bins and quartile whiskers would overflow
        return _note(f"no plot: the scores span {lo:g} to {hi:g}, wider than 64-bit floats can bin")
    if not plots_available():
        return ""
    fig = figure(10, 3.6)
    ax_h, ax_b = fig.subplots(1, 2, width_ratios=(3, 2))
    bins = 30 if hi > lo else 1
    for i, sys_ in enumerate(systems):
        ax_h.hist(scores[sys_], bins=bins, range=(lo, hi if hi > lo else lo + 1e-6), histtype="step",
                  linewidth=1.6, color=PALETTE[i % len(PALETTE)], label=_label(sys_ or "(none)"))
        if (heads or {}).get(sys_) is not None:  # the headline (a corpus score) beside the per-caption scores
            ax_h.axvline(heads[sys_], color=PALETTE[i % len(PALETTE)], linestyle="--", linewidth=1.2,
                         label=_label(f"{sys_ or '(none)'}: headline", 40))
    ax_h.set_title(_label(b.title, 80), fontsize=10)
    ax_h.set_xlabel(_label(b.metric or "score"))
    ax_h.set_ylabel("captions")
    whole_numbers(ax_h.yaxis)
    legend_outside(ax_h)
    try:
        ax_b.boxplot([scores[s] for s in systems], orientation="horizontal")
    except TypeError:  # matplotlib < 3.10
        ax_b.boxplot([scores[s] for s in systems], vert=False)
    ax_b.set_yticks(range(1, len(systems) + 1), [_label(s or "(none)", 20) for s in systems], fontsize=8)
    ax_b.set_xlabel(_label(b.metric or "score"))
    note = "" if len(scores) <= MAX_SYSTEMS_PLOTTED else f" ({MAX_SYSTEMS_PLOTTED} largest systems plotted)"
    return img(fig, f"score distribution per system: {b.title}" + note
               + ("; dashed: each system's headline" if heads else ""))


def _probes_where(runs: Runs, key: str) -> list[ProbeRun]:
    return [p for p in runs.probes if any(key in s for s in p.summary)]


def section_lgip(runs: Runs) -> str:
    """LGIP (Figure 2 of the LGIP paper): each model a point at (invariance error, semantic sensitivity)."""
    probes = _probes_where(runs, "invariance_error")
    pts, rows = [], []
    for p in probes:
        allrow = next((s for s in p.summary if s.get("flip_type") == "all"), p.summary[0])
        by_type = {s.get("flip_type"): s for s in p.summary if s.get("flip_type") != "all"}
        inv, sens = finite(allrow.get("invariance_error")), finite(allrow.get("gap_mean"))
        if inv is not None and sens is not None:
            pts.append((inv, sens, f"{p.model} ({p.suite})"))
        rows.append([p.model, p.suite, allrow.get("invariance_error"), allrow.get("gap_mean"),
                     allrow.get("positive_rate"), allrow.get("n_flips"), allrow.get("n_paraphrases")]
                    + [f"{fmt(t.get('gap_mean'), 3)} / {fmt(t.get('positive_rate'), 3)} (n={t.get('n_flips')})"
                       for t in by_type.values()])
    types = list(dict.fromkeys(t for p in probes for t in (s.get("flip_type") for s in p.summary) if t != "all"))
    out = ['<p>Invariance error E<sub>inv</sub> (eq. 4: mean |s(I,c) − s(I,c′)| over paraphrases; lower is '
           'better) against semantic sensitivity E<sub>sens</sub> (eq. 6: mean gap s(I,c) − s(I,c†) over flips; '
           'higher is better), one point per model, as in the LGIP paper\'s Figure 2; PR (eq. 8) is the share of '
           'flips scored below the original (0.5 = chance).</p>']
    if pts and plots_available():
        fig = figure(6.5, 4.6)
        ax = fig.subplots()
        for i, (x, y, name) in enumerate(pts):
            ax.scatter([x], [y], s=60, color=PALETTE[i % len(PALETTE)], zorder=3)
            ax.annotate(_label(name), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
        ax.axhline(0, color="grey", linewidth=0.8, linestyle=":")
        ax.margins(x=0.3, y=0.15)  # room for the labels
        ax.set_xlabel("invariance error $E_{inv}$ (lower is better)")
        ax.set_ylabel("semantic sensitivity $E_{sens}$ (higher is better)")
        ax.grid(alpha=0.3)
        out.append(img(fig, "LGIP invariance-sensitivity trade-off"))
    elif not pts:
        out.append(_note("no model has both an invariance error and a flip gap (no paraphrases or no flips)"))
    head = ["model", "suite", "E_inv", "E_sens (gap)", "PR", "flips", "paraphrases"] + [
        f"{t}: gap / PR" for t in types]
    out.append(table(head, [r + [""] * (len(head) - len(r)) for r in rows]))
    out.append(_src(*dict.fromkeys(p.summary_path for p in probes)))
    return "".join(out)


def perturb_table(p: ProbeRun) -> tuple[dict, str]:
    """{(language, kind): (original mean, perturbed mean, % change)} and where the % came from.

    PR-MCS Tables 2/7: % = (mean perturbed − mean original) / mean original × 100, negative when
    the score drops. Taken from the summary's ``pct_change`` (with ``mean_original`` /
    ``mean_perturbed``, and its ``kind="average"`` rows) when the probe wrote them; otherwise
    computed here from the rows' ``score`` / ``perturbed_score`` over the rows that have both
    (older probe outputs), with "average" = the mean of the per-kind perturbed means against the
    mean of their originals.
    """
    out = {}
    for s in p.summary:
        if "kind" in s and "pct_change" in s:
            lang = str(s.get("lang") or "-")
            out[(lang, str(s["kind"]))] = (finite(s.get("mean_original")), finite(s.get("mean_perturbed")),
                                           finite(s.get("pct_change")))
    if out:
        return out, "from the probe summary's pct_change"
    acc: dict = defaultdict(lambda: [0.0, 0.0, 0])
    for r in p.rows:
        o, q = finite(r.get("score")), finite(r.get("perturbed_score"))
        if o is None or q is None or "kind" not in r:
            continue
        a = acc[(str(r.get("lang") or "-"), str(r["kind"]))]
        a[0] += o
        a[1] += q
        a[2] += 1
    for key, (so, sq, n) in acc.items():
        mo, mq = so / n, sq / n
        out[key] = (mo, mq, 100.0 * (mq - mo) / mo if mo else None)
    for lang in dict.fromkeys(lang for lang, _ in list(out)):
        cells = [v for (lg, _), v in out.items() if lg == lang]
        mo, mq = statistics.fmean(c[0] for c in cells), statistics.fmean(c[1] for c in cells)
        out[(lang, "average")] = (mo, mq, 100.0 * (mq - mo) / mo if mo else None)
    return out, "computed from the rows' score and perturbed_score"


def section_perturb(runs: Runs) -> str:
    """PR-MCS robustness: % score change per perturbation and language (Tables 2/7), with an Average column."""
    probes = [p for p in _probes_where(runs, "robust_rate")]
    out = ['<p>Score of the perturbed caption relative to the original, per perturbation and language, as in '
           'PR-MCS Tables 2/7: each cell is the mean perturbed score and (mean perturbed − mean original) / '
           'mean original × 100, so a robust metric shows a large negative number. "average" is the mean of '
           'the per-perturbation means. Robust rate: share of perturbed captions scored below their original; '
           'mean score drop: mean of s(original) − s(perturbed).</p>']
    bars: list[tuple[str, list[str], list[float | None]]] = []
    for p in probes:
        data, how = perturb_table(p)
        kinds = [k for k in dict.fromkeys(k for _, k in data) if k != "average"] + ["average"]
        langs = list(dict.fromkeys(lang for lang, _ in data))
        rows = []
        for lang in langs:
            cells = [(data.get((lang, k)) or (None, None, None)) for k in kinds]
            orig = cells[-1][0] if cells[-1][0] is not None else next((c[0] for c in cells if c[0] is not None), None)
            rows.append([lang, orig] + [_pct_cell(c) for c in cells])
            bars.append((f"{p.model} · {lang}" if lang != "-" else p.model, kinds, [c[2] for c in cells]))
        out.append(f"<h3>{esc(p.model)} <small>({esc(p.suite)}; % {esc(how)})</small></h3>")
        out.append(table(["language", "original"] + kinds, rows))
        detail = [s for s in p.summary if "robust_rate" in s]
        out.append(table(["language", "perturbation", "perturbed", "not perturbable", "robust rate",
                          "mean score drop"],
                         [[s.get("lang") or "-", s.get("kind"), s.get("n"), s.get("n_not_perturbable"),
                           s.get("robust_rate"), s.get("mean_score_drop")] for s in detail]))
    if bars:
        out.insert(1, _perturb_plot(bars))
    out.append(_src(*dict.fromkeys(p.summary_path for p in probes)))
    return "".join(out)


def _pct_cell(c) -> str:
    orig, pert, pct = c
    if pct is None:
        return "–" if pert is None else fmt(pert)
    return f"{fmt(pert)} ({pct:+.2f}%)" if pert is not None else f"{pct:+.2f}%"


def _perturb_plot(bars) -> str:
    if not plots_available():
        return ""
    kinds = list(dict.fromkeys(k for _, ks, _ in bars for k in ks))
    fig = figure(min(12, 2 + 1.4 * len(kinds)), 3.8)
    ax = fig.subplots()
    width = 0.8 / len(bars)
    for i, (name, ks, vals) in enumerate(bars):
        xs = [kinds.index(k) + (i - (len(bars) - 1) / 2) * width for k in ks]
        ys = [0.0 if v is None else v for v in vals]
        ax.bar(xs, ys, width=width, color=PALETTE[i % len(PALETTE)], label=_label(name))
    ax.set_xticks(range(len(kinds)), [_label(k, 16) for k in kinds])
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_ylabel("score change vs original (%)")
    legend_outside(ax)
    ax.grid(axis="y", alpha=0.3)
    return img(fig, "PR-MCS percent score change per perturbation")


def section_specificity(runs: Runs) -> str:
    """SPECS specificity: mean score against the number of detail units (prefixes P_k), with wrong units."""
    probes = _probes_where(runs, "sr_pos")
    out = ['<p>Mean score of the caption prefix P<sub>k</sub> (its first k detail units) against k, solid; '
           'dashed: P<sub>k−1</sub> plus a wrong detail unit, plotted at k. A specific model rises along the '
           'solid line and stays below it on the dashed one (SPECS §3.1–3.2; SR<sub>pos</sub> and '
           'SR<sub>neg</sub> are the shares of steps that do). Captions differ in length, so the points at '
           'large k average fewer captions (counts in the table below the plot).</p>']
    lines = []  # (colour index, name, {k: mean}, dashed)
    counts = []
    for i, p in enumerate(probes):
        by_k: dict[int, list[float]] = defaultdict(list)
        wrong_k: dict[int, list[float]] = defaultdict(list)
        for r in p.rows:
            for k, v in enumerate(r.get("prefix_scores") or [], 1):
                if finite(v) is not None:
                    by_k[k].append(float(v))
            for k, v in enumerate(r.get("wrong_scores") or [], 2):
                if finite(v) is not None:
                    wrong_k[k].append(float(v))
        if by_k:
            counts.append((f"{p.model} ({p.suite})", {k: len(by_k[k]) for k in sorted(by_k)}))
            lines.append((i, f"{p.model} ({p.suite})", {k: statistics.fmean(v) for k, v in by_k.items()}, False))
        if wrong_k:
            lines.append((i, f"{p.model}: + wrong unit", {k: statistics.fmean(v) for k, v in wrong_k.items()}, True))
    if counts:
        if plots_available():
            fig = figure(7, 4.2)
            ax = fig.subplots()
            for i, name, means, dashed in lines:
                ks = sorted(means)
                ax.plot(ks, [means[k] for k in ks], marker="x" if dashed else "o", linestyle="--" if dashed else "-",
                        color=PALETTE[i % len(PALETTE)], label=_label(name))
            ax.set_xlabel("detail units in the caption (k)")
            ax.set_ylabel("mean score")
            whole_numbers(ax.xaxis)
            ax.grid(alpha=0.3)
            legend_outside(ax)
            out.append(img(fig, "specificity curves: score against number of detail units"))
        ks = sorted({k for _, c in counts for k in c})
        out.append(table(["captions with k units"] + [str(k) for k in ks],
                         [[name] + [c.get(k, 0) for k in ks] for name, c in counts]))
    else:
        out.append(_note("no per-item rows with prefix scores next to the summaries"))
    rows = [[p.model, p.suite, s.get("sr_pos"), s.get("sr_neg"), s.get("sr_mean"), s.get("n_images"),
             s.get("n_too_short")] for p in probes for s in p.summary]
    out.append(table(["model", "suite", "SR_pos", "SR_neg", "mean", "images", "too short"], rows))
    out.append(_src(*dict.fromkeys(q for p in probes for q in (p.summary_path, p.rows_path))))
    return "".join(out)


def section_other_probes(runs: Runs) -> str:
    """Every other probe suite (compositional, retrieval, ...): its summary rows as a table."""
    special = ("invariance_error", "robust_rate", "sr_pos")
    probes = [p for p in runs.probes if not any(k in s for s in p.summary for k in special)]
    out = []
    for p in probes:
        keys = list(dict.fromkeys(k for s in p.summary for k, v in s.items() if not isinstance(v, (dict, list))))
        out.append(f"<h3>{esc(p.suite)} — {esc(p.model)}</h3>")
        out.append(table(keys, [[s.get(k) for k in keys] for s in p.summary]))
        out.append(_src(p.summary_path))
    return "".join(out)


def _stat_cell(s: dict) -> str:
    v, lo, hi = finite(s.get("value")), finite(s.get("ci_low")), finite(s.get("ci_high"))
    if v is None:
        return "–"
    return f"{v:.1f}" + (f" [{lo:.1f}, {hi:.1f}]" if lo is not None and hi is not None else "")


def _p_matrix(names: list, m: list, resamples: int | None = None) -> str:
    """A p-value matrix; with ``resamples``, p below 1/R reads ``< 1/R`` (:func:`capscore._table.format_p`)."""
    return table(["", *names], [[a, *("–" if finite(v) is None else format_p(v, resamples) for v in row)]
                                for a, row in zip(names, m)])


def _significance(sig: dict) -> str:
    """Williams' test (Pearson, one-sided: row better than column) and the paired bootstrap of Δτ (two-sided),
    and the metrics not significantly different from the best (WMT's cluster)."""
    names = sig.get("names") or []
    return (f"<h4>significance ({esc(sig.get('n_resamples'))} resamples, {esc(sig.get('n_clusters'))} clusters, "
            f"α = {esc(sig.get('alpha'))})</h4>"
            f"<p>cluster of the best: <b>{esc(', '.join(sig.get('cluster') or []))}</b></p>"
            f"<p>paired bootstrap p of {esc(sig.get('kind'))}(row) − {esc(sig.get('kind'))}(column)</p>"
            + _p_matrix(names, sig.get("tau_p") or [], _resamples(sig.get("n_resamples")))
            + "<p>Williams test p (Pearson r of row greater than of column)</p>" + _p_matrix(names, sig.get("williams_p") or []))


def _resamples(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _system_tests(tests: list) -> str:
    rows, left = [], []
    for t in tests:
        if not isinstance(t, dict):
            continue
        if t.get("left_out"):
            left.append(f"{t.get('a')} vs {t.get('b')} ({t.get('metric')}, {t.get('model')}): {t['left_out']}")
            continue
        boot, ar = (list(t.get("tests") or []) + [{}, {}])[:2]
        boot, ar = (x if isinstance(x, dict) else {} for x in (boot, ar))
        ci = [finite(v) for v in (list(boot.get("ci") or []) + [None, None])[:2]]
        delta = finite(boot.get("delta"))
        p_boot, p_ar = ("–" if finite(x.get("p_value")) is None
                        else format_p(x["p_value"], _resamples(x.get("n_resamples"))) for x in (boot, ar))
        rows.append([t.get("model"), t.get("metric"), t.get("a"), t.get("b"), t.get("paired"),
                     "–" if delta is None else f"{delta:.4f}",
                     f"[{ci[0]:.4f}, {ci[1]:.4f}]" if None not in ci else "–", p_boot, p_ar])
    out = ""
    if rows:
        out += ("<p><b>paired tests between systems</b> (images resampled as clusters)</p>"
                + table(["model", "metric", "A", "B", "paired", "A − B", "95% CI", "p bootstrap", "p randomisation"],
                        rows))
    if left:
        out += _note("left out of the paired tests: " + "; ".join(left))
    return out


def section_correlation(runs: Runs) -> str:
    """Correlation with human judgments: the table with 95% intervals, and metric-vs-human scatter plots."""
    out = []
    for c in runs.correlations:
        res = c.results
        if not res:
            out.append(_note(f"{c.path}: no results"))
            continue
        r0 = res[0]
        names = list(dict.fromkeys(s.get("name") for r in res for s in r.get("stats") or []))
        boot = (f"95% bootstrap intervals over {r0.get('n_resamples')} resamples" if r0.get("n_resamples")
                else "no bootstrap intervals")
        out.append(f"<h3>{esc(r0.get('dataset'))}</h3><p>{esc(r0.get('source'))}; statistics ×100, "
                   f"{esc(boot)}, seed {esc(r0.get('seed'))}</p>")
        rows = []
        for r in res:
            by = {s.get("name"): s for s in r.get("stats") or []}
            rows.append([r.get("metric"), r.get("backbone") or "–"] + [_stat_cell(by[n]) if n in by else "–"
                                                                       for n in names] + [r.get("n")])
        out.append(table(["metric", "backbone"] + [str(n) for n in names] + ["n"], rows))
        skipped = {k: v for r in res[:1] for k, v in (r.get("skipped") or {}).items()}
        if skipped:
            out.append(_note("skipped: " + ", ".join(f"{v} {k}" for k, v in skipped.items())))
        if c.significance:
            out.append(_significance(c.significance))
        if c.items:
            out.append(_scatter(c))
        else:
            out.append(_note("no per-item scores (correlate_items.jsonl) beside correlate.json, so no scatter plot; "
                             "`capscore correlate --out` writes them for rating datasets"))
        out.append(_src(c.path, c.items_path))
    return "".join(out)


def _scatter(c: CorrelateRun) -> str:
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for it in c.items:
        x, y = finite(it.get("score")), finite(it.get("human"))
        if x is not None and y is not None:
            groups[(str(it.get("metric")), str(it.get("backbone") or ""))].append((x, y))
    keys = list(groups)[:MAX_SCATTER_PANELS]
    if not keys or not plots_available():
        return ""
    if not all(plottable(v for xy in groups[k] for v in xy) for k in keys):
        return _note("no scatter plot: the scores span more than 64-bit floats can lay out (values near ±1e308)")
    cols = min(3, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig = figure(3.6 * cols, 3.2 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False)
    stats = {(str(r.get("metric")), str(r.get("backbone") or "")): {s.get("name"): s.get("value")
                                                                     for s in r.get("stats") or []}
             for r in c.results}
    for ax, key in zip(axes.flat, keys):
        xs, ys = zip(*groups[key])
        ax.scatter(xs, ys, s=12, alpha=0.6, color=PALETTE[0])
        st = stats.get(key, {})
        tag = ", ".join(f"{n} {finite(v):.1f}" for n, v in st.items() if n in ("tau_b", "tau_c", "pearson")
                        and finite(v) is not None)
        ax.set_title(_label(" · ".join(k for k in key if k), 48) + (f"\n{tag}" if tag else ""), fontsize=9)
        ax.set_xlabel("metric score")
        ax.set_ylabel("human score")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    return img(fig, "metric score against human score, one point per item")


def section_training(runs: Runs) -> str:
    """Training curves from train's log.jsonl: losses and learning rate per step, evaluations per step."""
    out = []
    for t in runs.trainings:
        card = t.card
        title = " · ".join(str(x) for x in (card.get("recipe"), card.get("base_model"), card.get("data")) if x)
        out.append(f"<h3>{esc(t.log_path.parent.name)}</h3>" + (f"<p>{esc(title)}</p>" if title else ""))
        keys = [k for k in dict.fromkeys(k for e in t.steps for k in e)
                if k not in ("step", "sec") and any(finite(e.get(k)) is not None for e in t.steps)]
        keys = [k for k in keys if k != "lr"] + [k for k in keys if k == "lr"]  # the learning rate last
        ev_keys = [k for k in dict.fromkeys(k for e in t.evals for k in e)
                   if k != "step" and any(finite(e.get(k)) is not None for e in t.evals)]
        series = [(k, "training", t.steps) for k in keys] + [(k, "evaluation", t.evals) for k in ev_keys]
        if not series:
            out.append(_note("the log has no numeric entries yet"))
            continue
        if plots_available():
            out.append(_training_plot(series))
        if t.evals:
            first, last = t.evals[0], t.evals[-1]
            out.append(table(["evaluation", f"step {first['step']}", f"step {last['step']}"],
                             [[k, first.get(k), last.get(k)] for k in ev_keys]))
        out.append(_src(t.log_path))
    return "".join(out)


def _training_plot(series: list[tuple[str, str, list[dict]]]) -> str:
    """One panel per logged quantity (loss, each loss term, gradient norm, learning rate, each evaluation):
    on a shared axis the largest of them would flatten the others."""
    shown = series[:MAX_TRAINING_PANELS]
    cols = min(4, len(shown))
    nrows = math.ceil(len(shown) / cols)
    fig = figure(3.4 * cols, 2.8 * nrows)
    axes = list(fig.subplots(nrows, cols, squeeze=False).flat)
    for ax, (key, group, entries) in zip(axes, shown):
        pts = [(e["step"], finite(e.get(key))) for e in entries if finite(e.get(key)) is not None]
        if not plottable(y for _, y in pts):
            ax.set_title(_label(f"{key}: values too large to plot", 40), fontsize=9)
            continue
        ax.plot(*zip(*pts), marker="o" if group == "evaluation" or len(pts) < 50 else None,
                color="black" if key == "lr" else PALETTE[0 if group == "training" else 1])
        ax.set_title(_label(key if group != "evaluation" else f"eval: {key}", 40), fontsize=9)
        ax.set_xlabel("step")
        whole_numbers(ax.xaxis)
        ax.grid(alpha=0.3)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    note = "" if len(series) <= MAX_TRAINING_PANELS else f" (first {MAX_TRAINING_PANELS} of {len(series)} shown)"
    return img(fig, "training curves, one panel per quantity" + note)


def section_explain(runs: Runs) -> str:
    """`capscore explain` heat maps, as written, with what they show."""
    out = ['<div class="grid">']
    for e in runs.explains:
        a = e.about
        what = (f"word “{a.get('word')}” ({'refined t′' if a.get('refined') else 'token'}) · model {a.get('model')}"
                f" · cos {fmt(a.get('min'), 3)} … {fmt(a.get('max'), 3)}" if a else "no capscore metadata in the PNG")
        out.append(f"<figure>{_png(e.png, 'explain heat map')}<figcaption><q>{esc(a.get('caption', ''))}</q>"
                   f"<br>{esc(what)}<br><code>{esc(e.path)}</code></figcaption></figure>")
    out.append("</div>")
    return "".join(out)


SECTIONS = (  # (id, heading, function, present?)
    ("scores", "Score distributions per model, metric and system", section_scores, lambda r: bool(r.scores)),
    ("lgip", "LGIP: invariance and sensitivity", section_lgip, lambda r: bool(_probes_where(r, "invariance_error"))),
    ("perturb", "PR-MCS: score change under perturbations", section_perturb,
     lambda r: bool(_probes_where(r, "robust_rate"))),
    ("specificity", "SPECS: specificity curves", section_specificity, lambda r: bool(_probes_where(r, "sr_pos"))),
    ("probes", "Other probe suites", section_other_probes,
     lambda r: any(not any(k in s for s in p.summary for k in ("invariance_error", "robust_rate", "sr_pos"))
                   for p in r.probes)),
    ("correlation", "Correlation with human judgments", section_correlation, lambda r: bool(r.correlations)),
    ("training", "Training curves", section_training, lambda r: bool(r.trainings)),
    ("explain", "Explain: token–patch heat maps", section_explain, lambda r: bool(r.explains)),
)

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
header{background:#23395d;color:#fff;padding:18px 32px}header h1{margin:0 0 4px;font-size:24px}
header p{margin:2px 0;color:#dfe6f1;font-size:13px}main{padding:8px 32px 40px;max-width:1240px}
nav{margin:14px 0}nav a{margin-right:14px;color:#23395d}
section{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:4px 20px 16px;margin:18px 0}
h2{color:#23395d;border-bottom:2px solid #e8edf5;padding-bottom:4px}h3 small{color:#666;font-weight:normal}
table{border-collapse:collapse;margin:10px 0;font-size:13px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#eef2f8}td:first-child,th:first-child{text-align:left}table.text td{text-align:left;max-width:640px}
img.plot{max-width:100%;height:auto;display:block;margin:8px 0}.note{color:#8a5a00}.src{color:#777;font-size:12px}
code{font-size:12px;word-break:break-all}.grid{display:flex;flex-wrap:wrap;gap:16px}
figure{margin:0;max-width:560px}figcaption{font-size:13px;color:#333}
"""


def render(runs: Runs, *, title: str = "capscore report") -> str:
    """The whole page as one string."""
    present = [(sid, head, fn) for sid, head, fn, has in SECTIONS if has(runs)]
    nav = "".join(f'<a href="#{sid}">{esc(head)}</a>' for sid, head, _ in present)
    body = "".join(f'<section id="{sid}"><h2>{esc(head)}</h2>{fn(runs)}</section>\n' for sid, head, fn in present)
    if not plots_available():
        body = _note(NO_PLOTS) + body
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    inputs = ", ".join(f"<code>{esc(p)}</code>" for p in runs.inputs)
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>"
            f"<header><h1>{esc(title)}</h1><p>made {esc(when)} by capscore report from {inputs}</p></header>"
            f"<main><nav>{nav}</nav>\n{body}</main></body></html>\n")


def write_report(paths: Sequence[str | Path], out: str | Path, *, title: str = "capscore report",
                 limits: Limits = DEFAULT_LIMITS) -> tuple[Path, Runs]:
    """Discover the runs under ``paths``, render the page and write it to ``out`` (atomically).

    ``limits`` bounds what is read (:class:`capscore.report.rows.Limits`); every refusal is an
    :class:`~capscore.errors.InputError` naming the file (and row).
    """
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise param_error("out", "write_report", "a path ending in .html or .htm", str(out))
    runs = discover(paths, limits=limits)
    page = render(runs, title=title)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(page.encode("utf-8", errors="replace"))  # a lone surrogate (a file name that is not text): ?
    tmp.replace(out)
    return out, runs

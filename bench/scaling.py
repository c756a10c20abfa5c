"""Figure 6, scaling: time and peak memory of ingest and preprocessing over windows of 1, 2 (quick) or 1, 2, 4, 8
(full) days.

Ingest: an N-day window is N consecutive days of an ingest pass, and a pass of D days yields floor(D/N) disjoint
windows — the first N days of a longer run *are* an N-day run, so nothing is extrapolated. Its time is the sum of
the days' validate_day + day_stats; its memory is the peak RSS of the pass's process tree (Airflow's dag.test
process with the task code, spark-submit's JVM and Python workers) during the window: a later window's peak also
shows anything the process kept from earlier days. Preprocessing: one run per window (N train days + test day),
time = dictionary + transform, memory = the run's process tree peak.

Time should grow linearly with the rows read (time(N) / (rows ratio x time(1)) near 1; below 1 while a fixed
cost such as Spark's start-up is amortised) and memory stay flat (peak(N) / peak(1) near 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.common import Figure, Mode, Stat, ratio_of
from bench.ingest import IngestData
from bench.preprocessing import PreprocessData
from bench.proc import RSS_METHOD

SECTION = "6 scaling"
MB = 1e6


def ingest_windows(data: IngestData, days: int) -> tuple[list[float], list[float]]:
    """(seconds, peak RSS bytes) of every disjoint `days`-day window of every pass."""
    seconds, peaks = [], []
    for ingest_pass in data.passes:
        records = ingest_pass.days
        for first in range(0, len(records) - days + 1, days):
            window = records[first:first + days]
            seconds.append(sum(d.ingest_seconds for d in window))
            peaks.append(float(ingest_pass.child.peak_rss(window[0].start, window[-1].end)))
    return seconds, peaks


def series(mode: Mode, ingest: IngestData | None, prep: PreprocessData | None) -> dict[str, Any]:
    """{"ingest"|"preprocessing": {"days": [...], "seconds": [Stat], "rss": [Stat]}, "rss_method": ...}"""
    out: dict[str, Any] = {"rss_method": RSS_METHOD}
    if ingest is not None:
        windows = [ingest_windows(ingest, n) for n in mode.scaling_days]
        out["ingest"] = {"days": list(mode.scaling_days), "seconds": [Stat.of(s) for s, _ in windows],
                         "rss": [Stat.of(p) for _, p in windows],
                         "baseline_rss": [p.child.rss_before(p.days[0].start) for p in ingest.passes],
                         "runner_rss_after_day": [[p.child.root_rss_at(d.end) for d in p.days] for p in ingest.passes],
                         "peak_breakdown": max((p.child for p in ingest.passes),
                                               key=lambda c: c.peak_rss()).peak_breakdown}
    if prep is not None:
        runs = [prep.window(n) for n in mode.scaling_days]
        out["preprocessing"] = {"days": list(mode.scaling_days),
                                "seconds": [Stat.of([r.seconds for r in rs]) for rs in runs],
                                "rss": [Stat.of([float(r.peak_rss) for r in rs]) for rs in runs],
                                "rows": [rs[0].rows for rs in runs],
                                "peak_breakdown": max((r for rs in runs for r in rs),
                                                      key=lambda r: r.peak_rss).child.peak_breakdown}
    for name in ("ingest", "preprocessing"):
        if name in out:
            medians = [s.median for s in out[name]["seconds"]]
            slope, intercept = np.polyfit(out[name]["days"], medians, 1)
            out[name]["fit"] = {"seconds_per_day": float(slope), "fixed_seconds": float(intercept)}
    return out


def figures(scaling: dict[str, Any]) -> list[Figure]:
    rows = []
    labels = {"ingest": "ingest (validate + day_stats)", "preprocessing": "preprocessing (dictionary + transform)"}
    for name, label in labels.items():
        if name not in scaling:
            continue
        entry = scaling[name]
        base_time, base_rss = entry["seconds"][0], entry["rss"][0]
        fit = entry["fit"]
        # Linear = proportional to the rows read: N days for ingest, N train days + the test day for preprocessing.
        factors = ([r / entry["rows"][0] for r in entry["rows"]] if "rows" in entry
                   else [d / entry["days"][0] for d in entry["days"]])
        for days, factor, seconds, rss in zip(entry["days"], factors, entry["seconds"], entry["rss"]):
            unit_days = "train day(s) + test day" if name == "preprocessing" else "day(s)"
            rows.append(Figure(SECTION, f"{label}, {days} {unit_days}: time", "s", seconds,
                               f"smallest window's time x {factor:g} (rows ratio)", base_time.scaled(factor),
                               ratio_of(seconds, base_time.scaled(factor)), "medians", "~1 (linear) or below",
                               note=(f"fit: {fit['fixed_seconds']:.1f} s fixed + {fit['seconds_per_day']:.1f} s/day"
                                     if days == entry["days"][-1] else "")))
            rows.append(Figure(SECTION, f"{label}, {days} {unit_days}: peak RSS", "MB", rss.scaled(1 / MB),
                               "the smallest window's peak", base_rss.scaled(1 / MB), ratio_of(rss, base_rss),
                               "medians", "~1 (flat)"))
    return rows

"""docs/PERFORMANCE.md and docs/perf/*.png from one results JSON (bench/results/<UTC timestamp>.json).

`python -m bench.report bench/results/X.json` regenerates the page from a saved run without measuring again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.common import DOCS_DIR, PERF_DIR, REPO
from tasks.core.storage import atomic_file, write_text_atomic

METHOD = """\
How to read it: every value is the median of its samples, with the spread (min-max) and the number of samples n.
Every ratio compares two things measured in the same run: *paired* when both sides were measured interleaved,
sample by sample (loader, training, orchestration), otherwise the ratio of the medians with the widest range the
two spreads allow. Ratios are achieved / ideal: rows/s against a floor's rows/s, samples/s against a ceiling,
the work's time against the time around it, so 1.0 means no overhead. Scaling ratios say how far from linear
time (1.0) and flat memory (1.0) a window is. Quick mode runs the Spark-bound work once (one ingest pass, whose
days are the ingest samples; one preprocessing run per window, n=1) because each spark-submit costs tens of seconds
of fixed start-up on 2 cores; full mode repeats both (`--spark-repeats` overrides either mode).

1. **ingest**: one criteo_ingest DAG run per synthetic day (`scripts/run_dag.py`, `dag.test()`), with the task
   functions timed inside the tasks: `validate_raw_file` (every row checked + the GX report on the day's first
   1,000 rows and up to 1,000 bad rows, a fixed cost per day that dominates small days) and `validate_day` +
   `day_stats` (day stats by the default engine, arrow with the benchmark's local Spark master: validate_day
   writes them in its own pass and day_stats finds them complete). Floor: `pyarrow.csv.read_csv` of the same
   files, 40 binary columns, pyarrow's threads (all cores), each file parsed once before and once after the passes
   (the passes run in one child process, so not interleaved per day).
   Validation itself parses on one thread.
2. **preprocessing**: `build_dictionary` + `transform_dataset` (two spark-submits: dictionary from the day counts,
   transform to split binary + feature spec) over N train days + the test day; rows = every row read and written.
3. **loader**: full passes over a Criteo-shaped split-binary train mapping with `SplitBinaryDataset` via
   `PrefetchingReader`, no model: raw batches in the files' dtypes (`dataset.raw`, what a GPU run ships and decodes
   on the device), batches decoded on the host to float32/int32 (the CPU training path; depth 0 and 4). Consecutive
   batches are read as ~4 MB spans (one read per file per span, into one buffer per span that the reader reuses
   once the consumer has dropped that span's batches). Floor: `np.fromfile` of each file, one sequential pass. Page
   cache warm on every side.
4. **training**: `models/dlrm/train.py` under torchrun on CPU (gloo) at NVIDIA's DLRM sizes, against TorchRec's
   DLRM (`bench/torchrec_dlrm.py`: `torchrec.models.dlrm.DLRM`, variants plain / fused optimizer /
   DistributedModelParallel, the fastest one is the peer) on the same split-binary data read by the same reader,
   same sizes, batch, SGD lr schedule, steps and threads, launched alternately (A B, B A) at 1 process x all cores
   and at one process per core; samples/s from the log intervals after the first (warm-up) on both sides; AUC on
   the whole test mapping after the last step. Dense-only ceiling (`bench/train_ceiling.py`): the trainer's own
   model doing only its dense math (MLPs and interaction, forward + backward + SGD) on tensors made once, P
   processes counted as P x one process on B/P rows (free collectives): the trainer does this work and more, so it
   cannot be faster. FLOPs: forward multiply-accumulates of the MLPs and the interaction's batched GEMM x 2 x 3
   (backward = 2 x forward); embeddings move bytes, not FLOPs, and are left out. Achieved FLOP/s = FLOPs per
   sample x samples/s, against the best fp32 `torch.mm` (2048²) on the same threads and against the cores'
   theoretical peak (its derivation is in the table).
5. **orchestration**: from the same DAG runs: the run's wall time against the sum of its tasks' durations, and
   each task's Airflow duration against its task function timed inside it.
6. **scaling**: ingest windows are N consecutive days of an ingest pass (the first N days of a longer run are an
   N-day run); preprocessing windows are separate runs. Time = the work's own time; peak RSS = the sum over the
   whole process tree (the Airflow `dag.test` process or the preprocessing driver, spark-submit's JVM and its
   Python workers), method below.
7. **end to end** (section 2 "end to end"): raw TSV to a validated split-binary dataset through the command line
   (`bench/endtoend.py`): `python -m tasks criteo ingest --days 0-2 --jobs <cores>` then `criteo preprocess
   --train-days 0-1 --test-day 2 --engine E` once per engine (spark: the spark-submit jobs; arrow: the single-machine
   engine; nvtabular: NVIDIA's NVTabular workflow on CPU) over the same ingested days, three days of 1,000,000 rows (issue #17's measurement), wall time of the commands
   (process start, imports and JVM starts included); retrain-only = the dictionary + transform steps inside it. The
   engines' datasets are checked byte-identical. Floor: pyarrow read_csv of the same three files, before and
   after.
8. **Spark on a cluster** (section 7): `bench/cluster.py`: the three Criteo Spark jobs on tiny days (their time is
   their fixed cost) on `local[*]`, on a standalone master + worker on 127.0.0.1 with the same conf, and with the
   `cluster` profile, interleaved; paired ratios against local.
"""


def _num(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.01 or value == 0:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _ratio(value: float) -> str:
    return f"{value:.2f}" if value >= 0.095 else f"{value:.2g}"


def _stat(stat: dict[str, Any] | None, spread: bool = True) -> str:
    if not stat:
        return ""
    text = _num(stat["median"])
    if spread:
        text += f" ({_num(stat['min'])}–{_num(stat['max'])}, n={stat['n']})"
    return text


def _table(figures: list[dict[str, Any]]) -> list[str]:
    lines = ["| section | measurement | value: median (min–max, n) | floor / ceiling | its value | "
             "ratio (min–max) | target | notes |", "|---|---|---|---|---|---|---|---|"]
    for f in figures:
        ratio = f"**{_ratio(f['ratio']['median'])}** ({_ratio(f['ratio']['min'])}–{_ratio(f['ratio']['max'])}), " \
                f"{f['ratio_method']}" if f["ratio"] else ""
        lines.append(f"| {f['section']} | {f['name']} | {_stat(f['value'])} {f['unit']} | {f['reference_name']} | "
                     f"{_stat(f['reference'])} | {ratio} | {f['target']} | {f['note']} |")
    return lines


BUSY_SHARE = 0.10  # other work + steal above this share of the cores: figures are flagged


def _machine(results: dict[str, Any]) -> list[str]:
    machine, load = results["machine"], results["load"]
    cores = machine["cores"] or 1
    lines = [f"- machine: {cores} cores ({machine['cpu']}), {machine['ram_bytes'] / 2**30:.1f} GiB RAM, "
             f"{machine['platform']}",
             f"- load average at start (1, 5, 15 min): {load['start']}; at end: {load['end']}; " + (
                 f"1-min load during the run: mean {load['mean_1min']}, max {load['max_1min']} (sampled every 5 s)"
                 if "mean_1min" in load else f"highest 1-min load seen at stage boundaries: {load['max_1min']}"),
             f"- versions: {', '.join(f'{k} {v}' for k, v in machine['versions'].items())}; code at "
             f"{machine['commit']}{' with uncommitted changes' if machine['dirty'] else ''}",
             f"- run: {results['mode']} mode, {results['started_utc']} UTC, {results['seconds'] / 60:.1f} min wall, "
             f"{results.get('cpu_seconds', 0) / 60:.1f} min of CPU (this process and its children; on a quiet "
             f"machine the wall time lies between CPU / cores and CPU); raw results: `{results['results_path']}`"]
    if "other_share" in load:
        lines.append(f"- other work on the machine during the run: {load['other_cpu_s']} CPU s, "
                     f"{load['other_share']:.0%} of its {cores} cores (this run: {load['own_cpu_s']} CPU s); "
                     f"hypervisor steal {load['steal_share']:.0%}")
        busy = load["other_share"] + load["steal_share"] > BUSY_SHARE
        why = (f"other work took {load['other_share']:.0%} of the cores and steal "
               f"{load['steal_share']:.0%}") if busy else ""
    else:  # results written before other work was measured: the load average includes this run's own work
        busy = load["max_1min"] > 0.5 * cores
        why = f"1-min load up to {load['max_1min']} on {cores} cores, this run's own work included"
    if busy:
        lines.append(f"\n**The machine was busy while this ran** ({why}): absolute figures are slower and noisier "
                     "than on a quiet machine. Ratios of sides measured interleaved are less affected, but not immune.")
    return lines


def render(results: dict[str, Any], plots: list[Path]) -> str:
    lines = ["# recflow performance", "",
             "Generated by the benchmark harness; do not edit by hand. Produced by:", "",
             f"```\n{results['command']}\n```", "", *_machine(results), "", METHOD,
             f"Memory method: {results['rss_method']}.", ""]
    if results["only"]:
        lines += [f"Only these figures were run: {', '.join(results['only'])}.", ""]
    lines += ["## Figures", "", *_table(results["figures"]), ""]
    scaling = results.get("series", {}).get("scaling", {})
    for name in ("ingest", "preprocessing"):
        if name in scaling:
            fit = scaling[name]["fit"]
            lines.append(f"- {name} time, least-squares line over the windows: {fit['fixed_seconds']:.1f} s fixed "
                         f"+ {fit['seconds_per_day']:.1f} s per day")
    for name in ("ingest", "preprocessing"):
        breakdown = scaling.get(name, {}).get("peak_breakdown")
        if breakdown:
            parts = ", ".join(f"{proc} {rss / 1e6:,.0f} MB" for proc, rss in
                              sorted(breakdown.items(), key=lambda kv: -kv[1]))
            lines.append(f"- {name}: the process tree at its highest sample: {parts}")
    if scaling.get("ingest", {}).get("baseline_rss"):
        base = max(scaling["ingest"]["baseline_rss"]) / 1e6
        lines.append(f"- the ingest runner's tree RSS before its first day (Airflow + task code loaded): {base:.0f} MB")
    for index, after in enumerate(scaling.get("ingest", {}).get("runner_rss_after_day", [])):
        lines.append(f"- ingest pass {index + 1}: the runner process's own RSS after each day (MB): "
                     f"{', '.join(f'{rss / 1e6:,.0f}' for rss in after)}")
    lines += ["", "## Plots", ""] + [f"![{p.stem}](perf/{p.name})" for p in plots]
    with_cpu = all("cpu_seconds" in info for info in results["stages"].values())
    lines += ["", "## Stage durations", "", "| stage | wall s | " + ("CPU s (this process + children) | " * with_cpu)
              + "load at start | load at end |", "|---|---|" + "---|" * with_cpu + "---|---|"]
    for stage, info in results["stages"].items():
        cpu = f"{info['cpu_seconds']:.1f} | " if with_cpu else ""
        lines.append(f"| {stage} | {info['seconds']:.1f} | {cpu}{info['load_start']} | {info['load_end']} |")
    return "\n".join(lines) + "\n"


def plot_ratios(figures: list[dict[str, Any]], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [f for f in figures if f["ratio"] and not f["section"].startswith("6")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(11, 0.4 * len(rows) + 1.4))
    medians = [f["ratio"]["median"] for f in rows]
    errors = [[m - f["ratio"]["min"] for m, f in zip(medians, rows)],
              [f["ratio"]["max"] - m for m, f in zip(medians, rows)]]
    ax.barh(range(len(rows)), medians, xerr=errors, color="tab:blue", alpha=0.8, capsize=3)
    ax.set_yticks(range(len(rows)), [f"{f['section'].split()[1]}: {f['name']}"[:64] for f in rows], fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    if min(f["ratio"]["min"] for f in rows) < 0.05:  # Spark's fixed costs on small days: ratios span decades
        ax.set_xscale("log")
    ax.set_xlabel("ratio to floor / ceiling (1.0 = no overhead); bars: median, whiskers: min-max")
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.subplots_adjust(left=0.36, right=0.98, top=0.98, bottom=0.6 / (0.4 * len(rows) + 1.4))
    with atomic_file(path, "wb") as out:
        fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return path


def plot_scaling(scaling: dict[str, Any], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("ingest", "preprocessing") if n in scaling]
    if not names:
        return None
    fig, (time_ax, rss_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for name in names:
        entry = scaling[name]
        for ax, key, scale in ((time_ax, "seconds", 1.0), (rss_ax, "rss", 1e-6)):
            med = [s["median"] * scale for s in entry[key]]
            err = [[m - s["min"] * scale for m, s in zip(med, entry[key])],
                   [s["max"] * scale - m for m, s in zip(med, entry[key])]]
            ax.errorbar(entry["days"], med, yerr=err, marker="o", capsize=3, label=name)
    time_ax.set(xlabel="days (preprocessing: train days, + 1 test day)", ylabel="seconds", title="time")
    rss_ax.set(xlabel="days", ylabel="MB", title="peak RSS of the process tree")
    rss_ax.set_ylim(bottom=0)
    time_ax.set_ylim(bottom=0)
    for ax in (time_ax, rss_ax):
        ax.set_xticks(sorted({d for n in names for d in scaling[n]["days"]}))
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_file(path, "wb") as out:
        fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return path


DEFAULT_PAGE = "PERFORMANCE.md"


def write_docs(results: dict[str, Any], page_name: str = DEFAULT_PAGE) -> Path:
    """docs/<page_name> and its plots in docs/perf/ (prefixed with the page's name unless it is the default page, so
    a second run, e.g. a full-mode subset, sits beside the main page instead of replacing it)."""
    PERF_DIR.mkdir(parents=True, exist_ok=True)
    prefix = "" if page_name == DEFAULT_PAGE else Path(page_name).stem.lower() + "-"
    plots = [p for p in (plot_ratios(results["figures"], PERF_DIR / f"{prefix}ratios.png"),
                         plot_scaling(results.get("series", {}).get("scaling", {}), PERF_DIR / f"{prefix}scaling.png"))
             if p]
    page = DOCS_DIR / page_name
    write_text_atomic(page, render(results, plots))
    return page


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.report bench/results/<timestamp>.json", file=sys.stderr)
        return 2
    path = Path(args[0]) if Path(args[0]).is_absolute() else REPO / args[0]
    print(write_docs(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

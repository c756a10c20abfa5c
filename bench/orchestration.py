"""Figure 5, orchestration overhead: what Airflow adds around the work, from the ingest passes' DAG runs.

Per DAG run (one day): the run's wall time (scripts/run_dag.py summary, DAG parsing excluded) against the sum of its
task instances' durations; per task: Airflow's task duration against the task function timed inside it
(bench.worker's timers). Both sides come from the same run of the same day, so the ratios are paired. A ratio is
work / total: 1.0 means no overhead.
"""

from __future__ import annotations

from bench.common import Figure, Stat, paired_ratio
from bench.ingest import IngestData

SECTION = "5 orchestration"
# task_id in the criteo_ingest DAG -> the task function its body calls
TASK_FUNCTIONS = {"download": "download_day", "validate_raw": "validate_day", "day_stats": "day_stats"}


def figures(data: IngestData) -> list[Figure]:
    days = data.days
    walls = [d.wall for d in days]
    task_sums = [sum(d.durations.values()) for d in days]
    rows = [Figure(SECTION, "criteo_ingest DAG run (dag.test), wall", "s", Stat.of(walls), "sum of task durations",
                   Stat.of(task_sums), paired_ratio(task_sums, walls), "paired",
                   note="the rest is scheduling between tasks, XCom and DB writes")]
    for task_id, function in TASK_FUNCTIONS.items():
        durations = [d.durations[task_id] for d in days]
        inside = [d.functions[function] for d in days]
        rows.append(Figure(SECTION, f"task {task_id}, Airflow duration", "s", Stat.of(durations),
                           f"{function}() timed inside the task", Stat.of(inside), paired_ratio(inside, durations),
                           "paired"))
    return rows

"""The pipelines recflow ships, one registration line each: pipeline name -> the module of its dataset package
that runs it end to end on this machine (`make demo`). A module there provides

    add_arguments(parser: argparse.ArgumentParser) -> None     its demo's options (prefixed with its name)
    run_demo(args: argparse.Namespace) -> bool                 write synthetic sources, run its DAGs, print outcomes

Adding a pipeline = its dataset package, its DAG file(s) and one line here (docs/ARCHITECTURE.md, "How to add a
pipeline").
"""

from __future__ import annotations

PIPELINES: dict[str, str] = {
    "criteo_dlrm": "tasks.criteo.demo",
    "movielens_ncf": "tasks.movielens.demo",
    "outbrain_wide_deep": "tasks.outbrain.demo",
    "byo_dlrm": "tasks.byo.demo",
}

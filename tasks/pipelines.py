"""The pipelines recflow ships, one registration line each: pipeline name -> the module of its dataset package
that runs it end to end on this machine (`make demo`). A module there provides

    add_arguments(parser: argparse.ArgumentParser) -> None     its demo's options (prefixed with its name)
    run_demo(args: argparse.Namespace) -> bool                 write synthetic sources, run its DAGs, print outcomes

COMMANDS maps each command-line group (`recflow <name> ...`, tasks/cli.py) to its dataset package's cli module,
which provides `add_commands(pipelines)` (its sub-commands, built with tasks.cli's shared options) and
`EXPECTED_ERRORS` (its step errors that mean bad input or a step run out of order).

Adding a pipeline = its dataset package, its DAG file(s) and one line in each map here (docs/ARCHITECTURE.md, "How
to add a pipeline").
"""

from __future__ import annotations

PIPELINES: dict[str, str] = {
    "criteo_dlrm": "tasks.criteo.demo",
    "movielens_ncf": "tasks.movielens.demo",
    "outbrain_wide_deep": "tasks.outbrain.demo",
    "byo_dlrm": "tasks.byo.demo",
}

COMMANDS: dict[str, str] = {
    "criteo": "tasks.criteo.cli",
    "movielens": "tasks.movielens.cli",
    "outbrain": "tasks.outbrain.cli",
    "byo": "tasks.byo.cli",
}

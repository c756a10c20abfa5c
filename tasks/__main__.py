"""`python -m tasks ...`: recflow's command line (tasks/cli.py; installed as the `recflow` command too)."""

from tasks.cli import main

raise SystemExit(main())

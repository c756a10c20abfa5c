"""recflow's performance harness: every figure against its floor or ceiling, measured side by side in one run.

Run from the repository root: `.venv/bin/python -m bench.run [--quick|--full] [--only NAME]`. Results go to
bench/results/<UTC timestamp>.json; docs/PERFORMANCE.md and docs/perf/*.png are regenerated from them. Synthetic
inputs are generated once into bench/.cache/ (gitignored, like bench/results/).
"""

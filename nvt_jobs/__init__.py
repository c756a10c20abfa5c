"""Jobs that run in NVTabular's own environment (.venv-nvtabular), started by tasks.core.nvtabular.run_nvt_job as
`<nvt python> -m nvt_jobs.<job> ...`. They import NVTabular and recflow's dependency-free modules only, never the
main environment's packages (pyspark, torch, airflow)."""

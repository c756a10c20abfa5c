# Environment for running recflow's Airflow on this machine (sourced by the Makefile targets and tests).
# Embedded defaults: SQLite metadata DB under .airflow/, DAGs from dags/, small parallelism for 2 cores.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$REPO_ROOT/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$REPO_ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-4}"
export AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG="${AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG:-4}"
export AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT=120
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=10
export PATH="$REPO_ROOT/.venv/bin:$PATH"
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
# .venv holds the CPU builds of torch and TensorFlow (requirements.txt): runs that name no device train on the CPU
# here, where device auto would refuse them on a GPU host (tasks.core.gpus.check_usable). A deployment with CUDA
# builds sets auto or cuda.
export RECFLOW_TRAIN_DEVICE="${RECFLOW_TRAIN_DEVICE:-cpu}"

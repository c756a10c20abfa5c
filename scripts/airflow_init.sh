#!/usr/bin/env bash
# Prepare the local Airflow: metadata DB (SQLite under $AIRFLOW_HOME by default), pools, the spark_default
# connection. Idempotent: safe to run before every demo.
set -euo pipefail
airflow db migrate >/dev/null
# Pools keep a backfill from oversubscribing the machine: one Spark job and one trainer at a time on 2 cores.
airflow pools set spark "${RECFLOW_SPARK_SLOTS:-1}" "spark-submit jobs (each uses local[*])" >/dev/null
airflow pools set train "${RECFLOW_TRAIN_SLOTS:-1}" "torchrun training jobs" >/dev/null
if ! airflow connections get spark_default >/dev/null 2>&1; then
  airflow connections add spark_default --conn-type spark --conn-host 'local[*]' >/dev/null
fi
echo "airflow ready: AIRFLOW_HOME=$AIRFLOW_HOME"

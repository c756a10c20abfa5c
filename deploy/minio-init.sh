#!/bin/sh
# MinIO, once per `docker compose up` (idempotent): the models bucket, and a user for the tasks with only the rights
# they use on it (list the bucket; get, put and delete objects, conditional writes included). The root credentials
# stay in this one-shot container and the minio server; the Airflow aws_default connection holds the bucket user.
set -eu
root_user="$(cat /run/secrets/minio_root_user)"
root_password="$(cat /run/secrets/minio_root_password)"
app_password="$(cat /run/secrets/minio_recflow_password)"
mc alias set local http://minio:9000 "$root_user" "$root_password" >/dev/null
mc mb --ignore-existing local/recflow-models
cat > /tmp/recflow-models-policy.json <<'JSON'
{
  "Version": "2012-10-17",
  "Statement": [
    {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
     "Resource": ["arn:aws:s3:::recflow-models"]},
    {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                                   "s3:ListMultipartUploadParts"],
     "Resource": ["arn:aws:s3:::recflow-models/*"]}
  ]
}
JSON
mc admin policy create local recflow-models-rw /tmp/recflow-models-policy.json
mc admin user add local recflow "$app_password"
mc admin policy attach local recflow-models-rw --user recflow || true  # already attached on a re-run
echo "bucket recflow-models ready; user recflow has policy recflow-models-rw"

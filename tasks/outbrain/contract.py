"""What Outbrain's two feature engines agree on (spark_jobs/outbrain/features.py, nvt_jobs/outbrain.py) and the steps
read: NVIDIA's Wide & Deep feature definitions, the output folders, the features job's command line.

Every engine imports these from here (none from another engine, nor from the steps' module tasks/outbrain/features.py);
stdlib only, so NVTabular's environment imports it too (issue #25 item 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

# NVIDIA's WideAndDeep data/outbrain/features.py (reference/nvidia-formats.md §4.1), in its orders.
LABEL = "clicked"
DISPLAY_ID = "display_id"
RAW_AD_ID = "ad_id_raw"  # transform output only: the ad a prediction names (ad_id itself is hashed)
NUMERIC_COLUMNS = [
    "document_id_document_id_promo_sim_categories",
    "document_id_document_id_promo_sim_topics",
    "document_id_document_id_promo_sim_entities",
    "document_id_promo_ctr",
    "publisher_id_promo_ctr",
    "source_id_promo_ctr",
    "document_id_promo_count",
    "publish_time_days_since_published",
    "ad_id_ctr",
    "advertiser_id_ctr",
    "campaign_id_ctr",
    "ad_id_count",
    "publish_time_promo_days_since_published",
]
ONEHOT_COLUMNS = [
    "ad_id", "document_id", "platform", "document_id_promo", "campaign_id", "advertiser_id", "source_id",
    "geo_location", "geo_location_country", "geo_location_state", "publisher_id", "source_id_promo",
    "publisher_id_promo",
]
MULTIHOT_COLUMNS = {"topic_id_list": 3, "entity_id_list": 3, "category_id_list": 3}  # name -> max hotness
HASH_BUCKET_SIZES = {
    "document_id": 300000, "ad_id": 250000, "document_id_promo": 100000, "source_id_promo": 4000,
    "source_id": 4000, "geo_location": 2500, "advertiser_id": 2500, "geo_location_state": 2000,
    "publisher_id_promo": 1000, "publisher_id": 1000, "geo_location_country": 300, "platform": 4,
    "campaign_id": 5000, "topic_id_list": 350, "entity_id_list": 10000, "category_id_list": 100,
}
EMBEDDING_DIMENSIONS = {
    "document_id": 128, "ad_id": 128, "document_id_promo": 128, "source_id_promo": 64, "source_id": 64,
    "geo_location": 64, "advertiser_id": 64, "geo_location_state": 64, "publisher_id_promo": 64,
    "publisher_id": 64, "geo_location_country": 64, "platform": 19, "campaign_id": 128, "topic_id_list": 64,
    "entity_id_list": 64, "category_id_list": 64,
}
# CTR = clicks / views on the train split, 0 below this many train views (NVIDIA's ctr_thresh).
CTR_THRESHOLDS = {"ad_id": 5, "source_id_promo": 10, "publisher_id_promo": 10, "advertiser_id": 10,
                  "campaign_id": 10, "document_id_promo": 5}
TRAIN_MAX_DAY = 10      # train = day_event <= 10 and r >= VALID_FRACTION (NVIDIA: r > 0.2; r is continuous)
VALID_FRACTION = 0.2
PREBATCH_SIZE = 4096
MULTIHOT_PADDING = -1

# A features dataset: stats/ (what fit learned), parquet/<mapping>/, and the fit's summary.
STATS_DIR, PARQUET_DIR = "stats", "parquet"
STATS_FILE = "stats.json"


def parse_features_args(argv: Sequence[str], *, description: str = "Outbrain tables -> Wide & Deep features",
               extend: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The features job's command line, shared by the engines: `extend` adds an engine's own options (nvt_jobs/
    outbrain.py: --device, --workers)."""
    parser = argparse.ArgumentParser(description=description)
    if extend is not None:
        extend(parser)
    parser.add_argument("mode", choices=("fit", "transform"))
    parser.add_argument("--tables", required=True, type=Path, help="directory of <table>/part-*.parquet")
    parser.add_argument("--clicks-table", default=None, help="default: clicks_train (fit), clicks_test (transform)")
    parser.add_argument("--output", required=True, type=Path, help="where to write (the caller makes it atomic)")
    parser.add_argument("--stats", type=Path, help="transform: the stats/ directory a fit wrote")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and of train's row order")
    parser.add_argument("--parquet-files", type=int, default=8, help="part files per mapping")
    args = parser.parse_args(argv)
    if args.mode == "transform" and args.stats is None:
        parser.error("transform needs --stats (the stats/ directory of a fitted features dataset)")
    if args.seed < 0 or args.parquet_files < 1:
        parser.error("--seed must be >= 0 and --parquet-files >= 1")
    args.clicks_table = args.clicks_table or ("clicks_train" if args.mode == "fit" else "clicks_test")
    return args

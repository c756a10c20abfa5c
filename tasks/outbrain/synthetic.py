"""Synthetic Outbrain Click Prediction snapshots in Kaggle's exact file formats, with a planted, learnable signal.

The Kaggle dataset cannot be downloaded here, so this writes its nine files (tasks.outbrain.schema): CSV with a
header, `\\N` for a null platform / geo_location, empty source_id / publisher_id / publish_time in documents_meta,
geo like `US>SC>519`, `US>SC`, `US` or `--`, timestamps in ms since 1465876799998 over days 0..14. Keys agree across
files: every display of clicks_train / clicks_test is in events, every ad in promoted_content, every document
(event and promoted) in documents_meta. display_id follows time; clicks_train (days 0..11 and half of day 12) is
sorted by display_id then ad_id, with 2..12 distinct ads per display and exactly one click; clicks_test holds the
other half of day 12 and days 13..14.

The planted structure, all fixed by the seed:
- documents have a power-law popularity and a theme (one of THEMES); their topics, categories and entities come
  mostly from their theme's own pools, so two documents of one theme overlap there (TF-IDF similarity sees it);
- each ad has a latent quality = campaign effect + advertiser effect + its own, and a power-law serving weight;
  half of a display's ads are drawn from the event document's theme, half from all ads;
- the clicked ad of a display is drawn by a softmax (Gumbel-max) over quality + TOPIC_BONUS x [the ad's document
  shares the event document's theme], so ad / campaign / advertiser CTRs and the similarity features predict it.
The same seed and displays give byte-identical files (gzip and zip members carry fixed dates).

Usage: python -m tasks.outbrain.synthetic --out DIR --displays 20000 --seed 1 [--compress none|gz|zip]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import logging
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.core.storage import atomic_file, write_text_atomic
from tasks.outbrain.schema import DAY_MS, DAYS, EMPTY, NULL, TABLES, TIMESTAMP_ORIGIN_MS, TRAIN_DAYS

log = logging.getLogger(__name__)

THEMES = 40
TOPICS, TOPICS_PER_THEME = 300, 4
CATEGORIES, CATEGORIES_PER_THEME = 97, 2
TOPIC_BONUS = 2.0          # added to an ad's score when its document shares the event document's theme
ADS_PER_DISPLAY = (2, 12)
ZIP_DATE = (2016, 12, 20, 0, 0, 0)  # Kaggle's release month; fixed so the bytes do not depend on the clock
COMPRESSIONS = ("none", "gz", "zip")
SUFFIXES = {"none": ".csv", "gz": ".csv.gz", "zip": ".csv.zip"}
CHECKSUMS_FILE = "SHA256SUMS"
_COUNTRIES = ("US", "CA", "GB", "AU", "IN", "PH", "DE", "ZA", "SG", "FR")
_COUNTRY_WEIGHTS = (0.80, 0.06, 0.04, 0.03, 0.02, 0.01, 0.01, 0.01, 0.01, 0.01)
_STATES = ("CA", "TX", "FL", "NY", "SC", "IL", "PA", "OH", "GA", "NC", "MI", "WA", "ON", "BC", "H9", "00")
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@dataclass(frozen=True)
class SyntheticSnapshot:
    """The rows of every file (pyarrow tables of text-ready columns, nulls as nulls) and the planted truth."""

    tables: dict          # file stem -> pyarrow.Table in the CSV's column order
    ad_quality: np.ndarray      # [ads] the latent quality of ad_id k+1
    document_theme: np.ndarray  # [documents] the theme of document_id k+1

    def rows(self) -> dict[str, int]:
        return {name: t.num_rows for name, t in self.tables.items()}


def _zipf_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Power-law weights over a random order of n items, summing to 1."""
    weights = (rng.permutation(n) + 1.0) ** -exponent
    return weights / weights.sum()


def _hex_ids(n: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """n distinct-in-practice lowercase hex strings of `width` characters (uuids, entity ids), vectorised."""
    return _HEX[rng.integers(0, 16, (n, width))].view(f"S{width}").ravel().astype(str)


def _per_item_rows(counts: np.ndarray) -> np.ndarray:
    """Item index repeated counts[i] times (the owner of each row)."""
    return np.repeat(np.arange(len(counts)), counts)


def _document_tables(rng: np.random.Generator, documents: int, theme: np.ndarray):
    """documents_topics / categories / entities rows: each document draws from its theme's pools (and a little
    noise), so documents of one theme overlap; (document, value) pairs are distinct, as in Kaggle's files."""
    import pyarrow as pa

    theme_topics = rng.integers(0, TOPICS, (THEMES, TOPICS_PER_THEME))
    category_ids = 1000 + np.sort(rng.choice(1100, CATEGORIES, replace=False))
    theme_categories = rng.integers(0, CATEGORIES, (THEMES, CATEGORIES_PER_THEME))
    entities = max(THEMES * 4, documents // 4)
    entity_ids = _hex_ids(entities, 32, rng)

    def rows(counts, pick):
        owner = _per_item_rows(counts)
        value = pick(owner)
        key = np.unique(owner.astype(np.int64) * (1 << 32) + value)  # distinct pairs, sorted by document
        owner, value = key >> 32, key & 0xFFFFFFFF
        confidence = np.round(rng.uniform(0.008, 0.95, len(owner)), 12)
        return owner, value, confidence

    def themed(pool_of_theme, noise_size, noise=0.15):
        def pick(owner):
            # one element of each row's pool, never the rows x pool matrix (entities' pools grow with the documents:
            # 75 GiB at 2M displays)
            chosen = pool_of_theme[theme[owner], rng.integers(0, pool_of_theme.shape[1], len(owner))]
            random = rng.random(len(owner)) < noise
            chosen[random] = rng.integers(0, noise_size, int(random.sum()))
            return chosen
        return pick

    doc, topic, conf = rows(rng.integers(2, 5, documents), themed(theme_topics, TOPICS))
    topics = pa.table({"document_id": doc + 1, "topic_id": topic, "confidence_level": conf})
    doc, cat, conf = rows(rng.integers(1, 3, documents), themed(theme_categories, CATEGORIES))
    categories = pa.table({"document_id": doc + 1, "category_id": category_ids[cat], "confidence_level": conf})
    theme_entities = np.arange(THEMES)[:, None] + THEMES * np.arange(entities // THEMES)[None, :]
    doc, ent, conf = rows(rng.integers(0, 4, documents), themed(theme_entities, entities))
    entity_table = pa.table({"document_id": doc + 1, "entity_id": entity_ids[ent], "confidence_level": conf})
    return topics, entity_table, categories


def _documents_meta(rng: np.random.Generator, documents: int):
    """document_id, source_id, publisher_id, publish_time; empty where Kaggle has gaps (nulls here)."""
    import pyarrow as pa

    sources = max(10, documents // 25)
    publisher_of_source = rng.integers(1, max(5, sources // 3) + 1, sources)
    source = rng.integers(0, sources, documents)
    days_before = np.minimum(rng.exponential(60.0, documents), 5000.0)
    published = (TIMESTAMP_ORIGIN_MS - days_before * DAY_MS) // 1000 * 1000
    seconds = np.array(published, dtype="datetime64[ms]").astype("datetime64[s]")
    publish_time = np.char.replace(np.datetime_as_string(seconds), "T", " ")
    return pa.table({
        "document_id": np.arange(1, documents + 1),
        "source_id": pa.array(source + 1, mask=rng.random(documents) < 0.01),
        "publisher_id": pa.array(publisher_of_source[source], mask=rng.random(documents) < 0.05),
        "publish_time": pa.array(publish_time, mask=rng.random(documents) < 0.15),
    })


def _geo_locations(rng: np.random.Generator, n: int):
    """`US>SC>519`, `US>SC`, `US`, `--` (unknown) and a null now and then."""
    import pyarrow as pa
    import pyarrow.compute as pc

    country = np.array(_COUNTRIES)[rng.choice(len(_COUNTRIES), n, p=_COUNTRY_WEIGHTS)]
    depth = rng.random(n)
    state = pa.array(np.array(_STATES)[rng.integers(0, len(_STATES), n)], mask=depth > 0.9)
    dma = pa.array(rng.integers(500, 882, n).astype(str), mask=(depth > 0.8) | (country != "US"))
    geo = pc.binary_join_element_wise(pa.array(country), state, dma, ">", null_handling="skip")
    geo = pc.if_else(pa.array(_rare(rng, n, 0.005)), pa.scalar("--"), geo)
    return pc.if_else(pa.array(_rare(rng, n, 0.0002)), pa.scalar(None, pa.string()), geo)


def _rare(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """A mask with round(rate x n) rows set, at least one when n >= 100 (so small files show the case too)."""
    mask = np.zeros(n, dtype=bool)
    count = max(int(round(rate * n)), 1 if n >= 100 else 0)
    mask[rng.choice(n, min(count, n), replace=False)] = True
    return mask


def _platforms(rng: np.random.Generator, n: int):
    import pyarrow as pa

    return pa.array(rng.choice([1, 2, 3], n, p=[0.45, 0.45, 0.10]).astype(np.int8), mask=_rare(rng, n, 0.0005))


def _display_ads(rng: np.random.Generator, displays: int, event_theme: np.ndarray, ad_theme: np.ndarray,
                 ad_weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(display index, ad index) rows: 2..12 distinct ads per display, half drawn from the event document's theme
    (weighted by serving weight within it), half from all ads; sorted by display then ad."""
    low, high = ADS_PER_DISPLAY
    wanted = np.minimum(low + rng.binomial(high - low, 0.3, displays), high)
    slots = 2 * wanted + 4                               # spares: duplicates are dropped below
    owner = _per_item_rows(slots)
    by_theme = np.argsort(ad_theme, kind="stable")
    cumulative = np.concatenate(([0.0], np.cumsum(ad_weight[by_theme])))
    bounds = np.searchsorted(ad_theme[by_theme], np.arange(THEMES + 1))
    theme = event_theme[owner]
    lo, hi = cumulative[bounds[theme]], cumulative[bounds[theme + 1]]
    themed = (rng.random(len(owner)) < 0.5) & (hi > lo)
    u = np.where(themed, lo + rng.random(len(owner)) * (hi - lo), rng.random(len(owner)) * cumulative[-1])
    ad = by_theme[np.clip(np.searchsorted(cumulative, u, side="right") - 1, 0, len(ad_theme) - 1)]
    key = owner.astype(np.int64) * (1 << 32) + ad
    _, first = np.unique(key, return_index=True)           # distinct (display, ad), first draw order kept
    first.sort()
    owner, ad = owner[first], ad[first]
    starts = np.searchsorted(owner, np.arange(displays))
    rank = np.arange(len(owner)) - starts[owner]
    keep = rank < wanted[owner]
    owner, ad = owner[keep], ad[keep]
    owner, ad = _top_up(rng, owner, ad, displays, low, len(ad_theme))
    order = np.lexsort((ad, owner))
    return owner[order], ad[order]


def _top_up(rng: np.random.Generator, owner: np.ndarray, ad: np.ndarray, displays: int, low: int,
            ads: int) -> tuple[np.ndarray, np.ndarray]:
    """Give the rare display left with fewer than `low` distinct ads (its draws collided) other random ads."""
    counts = np.bincount(owner, minlength=displays)
    extra_owner, extra_ad = [], []
    for display in np.flatnonzero(counts < low):
        have = set(ad[owner == display].tolist())
        fresh = [a for a in rng.permutation(ads)[: low + len(have)].tolist() if a not in have][: low - len(have)]
        extra_owner += [display] * len(fresh)
        extra_ad += fresh
    if not extra_owner:
        return owner, ad
    return np.concatenate([owner, extra_owner]).astype(owner.dtype), np.concatenate([ad, extra_ad]).astype(ad.dtype)


def generate_snapshot(*, displays: int, seed: int) -> SyntheticSnapshot:
    """Draw every file's rows (see the module docstring); deterministic for equal arguments."""
    import pyarrow as pa

    if displays < 20:
        raise ValueError(f"displays={displays}: at least 20, so that every day has displays")
    rng = np.random.default_rng(seed)
    documents = max(300, displays // 2)
    ads = max(60, displays // 8)
    campaigns = max(10, ads // 6)
    advertisers = max(5, campaigns // 3)
    users = max(50, int(displays * 0.6))

    document_theme = rng.integers(0, THEMES, documents)
    document_weight = _zipf_weights(documents, 1.0, rng)
    topics, entities, categories = _document_tables(rng, documents, document_theme)
    meta = _documents_meta(rng, documents)

    ad_document = rng.choice(documents, ads)  # the promoted documents
    ad_campaign = rng.integers(0, campaigns, ads)
    campaign_advertiser = rng.integers(0, advertisers, campaigns)
    ad_advertiser = campaign_advertiser[ad_campaign]
    ad_quality = (0.7 * rng.normal(size=campaigns)[ad_campaign] + 0.4 * rng.normal(size=advertisers)[ad_advertiser]
                  + 0.8 * rng.normal(size=ads))
    ad_weight = _zipf_weights(ads, 0.9, rng)
    promoted = pa.table({"ad_id": np.arange(1, ads + 1), "document_id": ad_document + 1,
                         "campaign_id": ad_campaign + 1, "advertiser_id": ad_advertiser + 1})

    timestamp = np.sort(rng.integers(0, DAYS * DAY_MS, displays))  # display_id follows time, as Kaggle's does
    event_document = rng.choice(documents, displays, p=document_weight)
    user_ids = _hex_ids(users, 14, rng)
    user = rng.choice(users, displays, p=_zipf_weights(users, 0.6, rng))
    events = pa.table({"display_id": np.arange(1, displays + 1), "uuid": user_ids[user],
                       "document_id": event_document + 1, "timestamp": timestamp,
                       "platform": _platforms(rng, displays), "geo_location": _geo_locations(rng, displays)})

    owner, ad = _display_ads(rng, displays, document_theme[event_document], document_theme[ad_document], ad_weight)
    score = (ad_quality[ad] + TOPIC_BONUS * (document_theme[ad_document[ad]] == document_theme[event_document[owner]])
             + rng.gumbel(size=len(ad)))
    best = np.lexsort((-score, owner))
    starts = np.searchsorted(owner[best], np.arange(displays))
    clicked = np.zeros(len(ad), dtype=np.int8)
    clicked[best[starts]] = 1
    day = timestamp // DAY_MS
    in_train = (day < TRAIN_DAYS - 1) | ((day == TRAIN_DAYS - 1) & (rng.random(displays) < 0.5))
    train_row = in_train[owner]
    clicks_train = pa.table({"display_id": owner[train_row] + 1, "ad_id": ad[train_row] + 1,
                             "clicked": clicked[train_row]})
    clicks_test = pa.table({"display_id": owner[~train_row] + 1, "ad_id": ad[~train_row] + 1})

    views = 2 * displays
    view_time = np.sort(rng.integers(0, DAYS * DAY_MS, views))
    page_views = pa.table({"uuid": user_ids[rng.choice(users, views)],
                           "document_id": rng.choice(documents, views, p=document_weight) + 1,
                           "timestamp": view_time, "platform": _platforms(rng, views),
                           "geo_location": _geo_locations(rng, views),
                           "traffic_source": rng.choice([1, 2, 3], views, p=[0.6, 0.3, 0.1]).astype(np.int8)})
    tables = {"clicks_train": clicks_train, "clicks_test": clicks_test, "events": events,
              "promoted_content": promoted, "documents_meta": meta, "documents_topics": topics,
              "documents_entities": entities, "documents_categories": categories, "page_views_sample": page_views}
    return SyntheticSnapshot({name: tables[name] for name in TABLES}, ad_quality, document_theme)


def csv_bytes(name: str, data, block_rows: int = 1 << 20) -> bytes:
    """A table's CSV as Kaggle writes it: header, comma-separated, no quoting, nulls as `\\N` (or empty in
    documents_meta), a newline after every row. Formatted by pyarrow, block by block."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table_schema = TABLES[name]
    parts = [table_schema.header.encode() + b"\n"]
    for start in range(0, data.num_rows, block_rows):
        chunk = data.slice(start, block_rows)
        columns = []
        for column in table_schema.columns:
            text = chunk.column(column.name).cast(pa.string())
            if column.nullable:
                text = pc.fill_null(text, NULL if column.null_text == NULL else EMPTY)
            columns.append(text)
        lines = pc.binary_join_element_wise(pc.binary_join_element_wise(*columns, ","), "", "\n")
        parts.append("".join(lines.to_pylist()).encode())
    return b"".join(parts)


def _compressed(name: str, content: bytes, compress: str) -> bytes:
    if compress == "gz":
        buffer = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as gz:
            gz.write(content)
        return buffer.getvalue()
    if compress == "zip":  # Kaggle's form: <file>.csv.zip holding <file>.csv
        info = zipfile.ZipInfo(f"{name}.csv", date_time=ZIP_DATE)
        info.create_system, info.external_attr, info.compress_type = 3, 0o100644 << 16, zipfile.ZIP_DEFLATED
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            zf.writestr(info, content, compresslevel=6)
        return buffer.getvalue()
    return content


def write_snapshot(out_dir: Path, *, displays: int, seed: int, compress: str = "none") -> dict:
    """Write the nine files (as `<file>.csv`, `.csv.gz` or `.csv.zip`) and SHA256SUMS into `out_dir`, each
    atomically; other forms of the same files there are removed (a source must not serve two). Returns what was
    written: {"files": {stem: path}, "rows": {stem: rows}, "sha256": {file name: hex}, "displays", "seconds"}."""
    if compress not in COMPRESSIONS:
        raise ValueError(f"compress={compress!r}: expected one of {list(COMPRESSIONS)}")
    start = time.monotonic()
    out_dir = Path(out_dir)
    snapshot = generate_snapshot(displays=displays, seed=seed)
    files, digests = {}, {}
    for name, data in snapshot.tables.items():
        content = _compressed(name, csv_bytes(name, data), compress)
        path = out_dir / f"{name}{SUFFIXES[compress]}"
        with atomic_file(path, "wb") as f:
            f.write(content)
        for other in set(SUFFIXES.values()) - {SUFFIXES[compress]}:
            (out_dir / f"{name}{other}").unlink(missing_ok=True)
        files[name], digests[path.name] = str(path), hashlib.sha256(content).hexdigest()
    write_text_atomic(out_dir / CHECKSUMS_FILE, "".join(f"{digest}  {file}\n" for file, digest in sorted(
        digests.items())))
    rows = snapshot.rows()
    seconds = time.monotonic() - start
    log.info("wrote a synthetic Outbrain snapshot to %s: %d displays, %d rows in %d files (%s), %.1f s, %.0f rows/s",
             out_dir, displays, sum(rows.values()), len(files), compress, seconds, sum(rows.values()) / seconds)
    return {"files": files, "rows": rows, "sha256": digests, "displays": displays, "seconds": round(seconds, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a synthetic Outbrain snapshot in Kaggle's file formats.")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the files and SHA256SUMS into")
    parser.add_argument("--displays", type=int, default=20_000, help="displays in events.csv")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--compress", choices=COMPRESSIONS, default="none")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_snapshot(args.out, displays=args.displays, seed=args.seed, compress=args.compress)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

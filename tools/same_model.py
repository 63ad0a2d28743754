"""Whether two model directories hold the same model, checkpoint by checkpoint, bit for bit
(the dense state and every row, key by key, but the saves' dirty bit), and their mean
predict AUCs (``passes.jsonl``): a run with faults against its no-fault twin, after the fact.

    .venv/bin/python tools/same_model.py /tmp/soak/models/chaos /tmp/soak-nofault/models/nofault

Exit code 0: every checkpoint both hold is the same; 1: not (the first difference printed);
2: bad arguments. ``tools/chaos.py`` prints the same line at the end of a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from chaos_checks import kept_records, read_records, same_model  # noqa: E402


def mean_auc(model: Path) -> tuple[float | None, int]:
    """(mean predict AUC, passes) of the passes ``model``'s ``passes.jsonl`` keeps."""
    aucs = [
        float(r["predict_auc"])
        for r in kept_records(read_records(model))
        if r.get("predict_auc") is not None
    ]
    return (sum(aucs) / len(aucs) if aucs else None), len(aucs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="a model directory (a job's model_save_path)")
    ap.add_argument("twin", type=Path, help="the model directory to compare it with")
    args = ap.parse_args(argv)
    for path in (args.model, args.twin):
        if not path.is_dir():
            print(f"same_model.py: {path} is not a directory", file=sys.stderr)
            return 2
    for name, path in (("model", args.model), ("twin", args.twin)):
        auc, n = mean_auc(path)
        print(f"{name}: {path}: {n} passes, mean predict AUC {auc}")
    match = same_model(args.model, args.twin)
    print(match.line())
    return 0 if match.compared and match.first_difference is None else 1


if __name__ == "__main__":
    sys.exit(main())

"""A user's own kustomize overlay over ``cpu-dev`` (the k8s README's layout), written into a
temporary directory for the deploy tests that render or run it."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def single_rank_pool(tmp: Path, trainers: int) -> Path:
    """An overlay of one's own over cpu-dev (the README's layout): ``trainers`` pods, each a
    group of one rank (components/single-rank-groups)."""
    (tmp / "streamrec").symlink_to(ROOT)
    mine = tmp / "my-cluster"
    (mine / "counts").mkdir(parents=True)
    components = "../streamrec/deploy/k8s/components"
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../streamrec/deploy/k8s/overlays/cpu-dev"],
                "components": [
                    "counts",
                    f"{components}/counts",
                    f"{components}/single-rank-groups",
                ],
            }
        )
    )
    (mine / "counts" / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1alpha1",
                "kind": "Component",
                "replicas": [{"name": "trainer", "count": trainers}],
            }
        )
    )
    return mine

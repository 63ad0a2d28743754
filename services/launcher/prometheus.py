"""The local Prometheus of ``streamrec up --prometheus``: its config and its rules.

It scrapes every service of the stack each second under the job names the dashboards and
alerts select by (the same as in Kubernetes), and evaluates the alert rules of
:mod:`streamrec.observability.alerts` (the one source of them). Files, under ``RUN/prometheus``::

    prometheus.yml       scrape_configs (static targets per job) and rule_files
    alerts.rules.yml     the plain rules file, written from alerts.rule_groups()
    data/                the TSDB
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from streamrec.launcher.errors import StackError

#: Prometheus ``job`` label of each service, the same locally and in Kubernetes
#: (docs/design-notes.md, "One Prometheus job label").
API_JOB = "streamrec-api"
STORE_JOB = "streamrec-embedding-store"
SAMPLER_JOB = "streamrec-sampler"
TRAINER_JOB = "streamrec-trainer"
JOBS = (API_JOB, STORE_JOB, SAMPLER_JOB, TRAINER_JOB)

CONFIG_FILE = "prometheus.yml"
RULES_FILE = "alerts.rules.yml"
#: Scrape and rule evaluation period: a short demo job still gives rates and alerts data.
INTERVAL = "1s"


def prometheus_binary() -> str:
    """The prometheus server from PATH, else the Debian package's path."""
    found = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(found).is_file():
        raise StackError(
            "--prometheus: no prometheus binary on PATH nor at /usr/bin/prometheus "
            "(`apt-get install prometheus`)"
        )
    return found


def prometheus_config(targets: dict[str, list[str]]) -> dict:
    """The prometheus.yml mapping: one static scrape job per entry of ``targets`` (job name
    -> ``host:port`` list), the rules file beside it."""
    return {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [RULES_FILE],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(hosts)}]}
            for job, hosts in targets.items()
        ],
    }


def write_files(directory: Path, targets: dict[str, list[str]]) -> Path:
    """Writes prometheus.yml and alerts.rules.yml under ``directory``; returns the config."""
    from streamrec.observability import alerts  # the rules' one source

    directory.mkdir(parents=True, exist_ok=True)
    (directory / RULES_FILE).write_text(yaml.safe_dump(alerts.rule_groups(), sort_keys=False))
    config = directory / CONFIG_FILE
    config.write_text(yaml.safe_dump(prometheus_config(targets), sort_keys=False))
    return config

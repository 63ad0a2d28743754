"""Alert rules and Grafana dashboards as code.

The one source of ``deploy/prometheus/`` and ``deploy/k8s/base/{dashboards,monitoring}/``:
``python -m streamrec.observability generate`` writes them, ``--check`` compares.
"""

"""semhealth's Grafana dashboards, built with grafana-foundation-sdk.

``dashboards()`` returns every dashboard as ``(file name, JSON text)``; ``grafana/generate.py``
writes them to ``grafana/dashboards/`` and ``helm/semhealth/dashboards/``.
"""

from semhealth_grafana.render import FILES, dashboards, render

__all__ = ["FILES", "dashboards", "render"]

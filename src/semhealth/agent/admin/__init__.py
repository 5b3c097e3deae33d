"""The admin port: /metrics, /alerts, /healthz, /readyz and their access rules."""

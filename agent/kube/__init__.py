"""Kubernetes: sidecar injection into Pod templates, by command (``semhealth inject``) and by
mutating admission webhook (``semhealth injector``), through one code path."""

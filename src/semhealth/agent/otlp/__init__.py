"""OpenTelemetry ways in and out beside the proxy: GenAI telemetry received, evaluations sent."""

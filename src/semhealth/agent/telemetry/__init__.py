"""Telemetry: the instrument table, its buckets, the recorder and the OpenTelemetry pipeline."""

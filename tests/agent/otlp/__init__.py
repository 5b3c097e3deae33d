"""Tests of the OTLP tap: GenAI telemetry in, records out."""

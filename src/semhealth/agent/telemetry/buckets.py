"""Every histogram's bucket boundaries, named once, with the range each covers.

Boundaries are part of the metrics' contract: dashboards and alert rules
(``histogram_quantile``) depend on them. ``tests/agent/test_buckets.py`` pins
them as literals so that a change is a decision, not an accident.
"""

from __future__ import annotations

# OpenTelemetry GenAI semantic conventions: gen_ai.client.operation.duration,
# gen_ai.client.operation.time_to_first_chunk and .time_per_output_chunk. 10 ms .. 82 s.
GEN_AI_DURATION_S = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip

# GenAI conventions: gen_ai.client.token.usage. 1 .. 67M tokens, powers of 4.
GEN_AI_TOKENS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip

# GenAI conventions: gen_ai.server.time_to_first_token. 1 ms .. 10 s.
GEN_AI_TTFT_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip

# GenAI conventions: gen_ai.server.time_per_output_token. 10 ms .. 2.5 s.
GEN_AI_TPOT_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)

# semantic_health_stream_continuity_index_seconds: the std-dev of inter-delta gaps.
# Healthy streams sit at a few ms; the default StreamChoppy alert fires at P95 > 15 ms,
# so boundaries are dense from 1 to 50 ms and 15 ms is one of them. 0.5 ms .. 5 s.
CONTINUITY_S = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03,
    0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip

# semantic_health_stream_max_gap_seconds: the longest silence inside one stream. 10 ms .. 60 s.
MAX_GAP_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

# semantic_health_context_relevance_score and _answer_relevance_score: calibrated 0..1.
# Dense around 0.5-0.95 so histogram_quantile(0.5, ...) is accurate near the default
# threshold of 0.75 (linear interpolation inside a 0.025-wide bucket errs by < 0.0125).
RELEVANCE = (
    0.1, 0.2, 0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.675, 0.7, 0.725, 0.75, 0.775, 0.8, 0.825,
    0.85, 0.875, 0.9, 0.925, 0.95, 0.975, 1.0,
)  # fmt: skip

# semhealth_analysis_duration_seconds: the agent's own analysis time per stream. 10 us .. 1 s.
ANALYSIS_S = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip

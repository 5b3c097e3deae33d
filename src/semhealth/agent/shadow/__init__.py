"""Shadow traffic: a candidate upstream answers the same requests as the primary, and each
pair is compared (tokens, JSON, tool calls, timing) without the client ever waiting on it."""

"""``semhealth demo``: the sidecar in front of a built-in simulated LLM, with traffic."""

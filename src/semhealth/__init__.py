"""semhealth: semantic-health observability for LLM services."""

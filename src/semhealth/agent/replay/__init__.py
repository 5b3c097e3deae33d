"""Recorded traffic: ``semhealth run --record`` writes it, ``semhealth replay`` scores it
offline through the same pipeline (see ``format`` for the recording format)."""

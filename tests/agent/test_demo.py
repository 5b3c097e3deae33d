"""The demo's live table: what a newcomer reads while the simulated traffic runs."""

from __future__ import annotations

from semhealth.agent.alerting import ActiveAlert
from semhealth.agent.demo import DemoSummary


def test_the_table_says_when_no_alert_is_pending_or_firing() -> None:
    text = DemoSummary(0.5).render()
    assert "alerts: none pending or firing" in text


def test_the_table_lists_pending_and_firing_alerts_with_labels_and_value() -> None:
    alerts = [
        ActiveAlert("OutputValidityLow", {"route": "chat", "model": "m"}, "firing", 0.8512),
        ActiveAlert("LatencySLO", {"route": "chat", "prompt_class": "short"}, "pending", None),
    ]
    text = DemoSummary(0.5, alerts=lambda: alerts).render()
    assert "alerts: 2 pending or firing" in text
    assert "firing  OutputValidityLow     model=m route=chat  value=0.851" in text
    assert "pending LatencySLO" in text and "value=-" in text

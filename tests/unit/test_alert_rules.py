"""The alerting rules (``monitoring/alerts.yml``) load, and their unit tests pass under
``promtool test rules``; every alert has a case that fires it and one that does not."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from devstack.prometheus import binary

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=MONITORING
    )


def test_the_rules_load() -> None:
    done = promtool("check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_rule_unit_tests_pass() -> None:
    done = promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    rules: dict[str, Any] = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    tests: dict[str, Any] = yaml.safe_load((MONITORING / "alerts_test.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fired == alerts
    assert quiet == alerts


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The runner really compares: a test expecting the stuck partition to fire at once fails."""
    rules = tmp_path / "alerts.yml"
    rules.write_text((MONITORING / "alerts.yml").read_text())
    wrong = tmp_path / "wrong_test.yml"
    wrong.write_text(
        yaml.safe_dump(
            {
                "rule_files": ["alerts.yml"],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [
                            {
                                "series": "contextcore_consumer_oldest_in_flight_age_seconds"
                                '{consumer="build",topic="t",partition="0"}',
                                "values": "0x10",
                            }
                        ],
                        "alert_rule_test": [
                            {
                                "eval_time": "5m",
                                "alertname": "ContextcorePartitionStuck",
                                "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                            }
                        ],
                    }
                ],
            }
        )
    )
    done = subprocess.run(
        [binary("promtool"), "test", "rules", str(wrong)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr

"""A database URL in an error line or a log never shows its password."""

from __future__ import annotations

import pytest

from contextcore.storage.pool import redact


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:s3cret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@h/db?password=s3cret", "postgresql://u@h/db?password=***"),
        (
            "postgresql://u@h/db?sslmode=require&password=s%26cret&application_name=a",
            "postgresql://u@h/db?sslmode=require&password=***&application_name=a",
        ),
        ("postgresql://u:a@h/db?password=b", "postgresql://u:***@h/db?password=***"),
        ("postgresql://u@h/db?sslmode=require", "postgresql://u@h/db?sslmode=require"),
    ],
)
def test_a_password_is_never_shown(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert "cret" not in redact(url)

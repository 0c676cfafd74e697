"""Provisioning's pure parts: URLs and the SCRAM verifier sent instead of a password."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from contextcore.storage.provision import Login, scram_verifier
from schemas.errors import ConfigurationError


def test_a_login_is_read_from_its_url() -> None:
    assert Login.of("postgresql://run%40me:p%3Aw@db:5432/contextcore") == Login(
        "run@me", "p:w", "contextcore"
    )
    with pytest.raises(ConfigurationError):
        Login.of("postgresql://db:5432/contextcore")


def test_the_verifier_is_the_one_a_scram_client_proves_knowledge_of() -> None:
    salt = b"0123456789abcdef"
    verifier = scram_verifier("s3cret-pass", salt=salt, iterations=4096)
    scheme, rest = verifier.split("$", 1)
    iterations_salt, keys = rest.split("$")
    stored_b64, server_b64 = keys.split(":")
    assert scheme == "SCRAM-SHA-256"
    assert iterations_salt == f"4096:{base64.b64encode(salt).decode()}"
    # what a client derives from the password (RFC 5802): its key hashes to the stored key
    salted = hashlib.pbkdf2_hmac("sha256", b"s3cret-pass", salt, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert base64.b64decode(stored_b64) == hashlib.sha256(client_key).digest()
    assert base64.b64decode(server_b64) == hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    assert "s3cret" not in verifier


def test_a_password_outside_printable_ascii_is_refused() -> None:
    for password in ("naïve", "tab\there"):
        with pytest.raises(ConfigurationError, match="printable ASCII"):
            scram_verifier(password)

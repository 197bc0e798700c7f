"""API keys: the secret a client sends, the hash the mesh keeps, and the record of what a key may do.

Pure: no NATS here. A secret is ``mf-`` and 43 URL-safe characters (256 random bits), shown once by
``meshfront keys create`` and never stored: the keys bucket holds its SHA-256 (hex) as the record's key, so
a reader of NATS cannot answer as any tenant. A plain hash suffices (no salt, no slow KDF) because the secret
is random, not a password: nothing smaller than 2^256 tries finds it. ``key_id`` (``key_`` and the first 12
hex digits of the hash) names a key in ``keys list`` and ``keys revoke`` without revealing it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import secrets
from typing import Any

import orjson

SECRET_PREFIX = "mf-"  # noqa: S105 - the prefix of every secret, not one
KEY_ID_PREFIX = "key_"
_KEY_ID_HEX = 12
# Tenants name per-tenant metrics series and usage keys in NATS: a subject token, never a wildcard or a dot.
# A leading '_' is kept for the mesh's own names (ANONYMOUS).
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_CLASS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# The usage of requests refused before any key was known (no key, an unknown one).
ANONYMOUS = "_anonymous"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """The SHA-256 (hex) a secret is kept under."""
    return hashlib.sha256(secret.encode()).hexdigest()


def key_id(digest: str) -> str:
    """The public name of the key whose hash is ``digest``."""
    return KEY_ID_PREFIX + digest[:_KEY_ID_HEX]


def same_digest(a: str, b: str) -> bool:
    return hmac.compare_digest(a, b)


def tenant_error(name: str) -> str:
    """Why ``name`` is not a tenant name (one line), or ""."""
    if not _TENANT.fullmatch(name):
        return (f"--tenant {name!r} is not a tenant name: 1 to 64 letters, digits, '_' and '-', starting with a "
                "letter or digit")
    return ""


def class_error(name: str) -> str:
    """Why ``name`` (a class, or a key's comma list of them: services/gateway/scheduling.py) is not one, or ""."""
    if name and not all(_CLASS.fullmatch(c) for c in name.split(",")):
        return (f"--policy-class {name!r} is not a class name or a comma list of them: 1 to 64 letters, digits, "
                "'_', '.' and '-' each")
    return ""


@dataclasses.dataclass(frozen=True)
class KeyRecord:
    """What a key may do. A limit of 0 is no limit; an empty ``models`` is every model."""

    key_id: str
    tenant: str
    policy_class: str = ""
    rpm: int = 0
    tpm: int = 0
    max_concurrency: int = 0
    models: tuple[str, ...] = ()
    created_at: float = 0.0

    @property
    def limited(self) -> bool:
        """Whether any quota applies (a key without one never reaches the quota bucket)."""
        return bool(self.rpm or self.tpm or self.max_concurrency)

    @property
    def policy_classes(self) -> tuple[str, ...]:
        """The classes the key may run in (the header picks among them); the first is its own. Empty: the
        router's default class, none to pick."""
        return tuple(self.policy_class.split(",")) if self.policy_class else ()

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models

    def errors(self) -> list[str]:
        out = [e for e in (tenant_error(self.tenant), class_error(self.policy_class)) if e]
        for flag, value in (("--rpm", self.rpm), ("--tpm", self.tpm), ("--max-concurrency", self.max_concurrency)):
            if value < 0:
                out.append(f"{flag} must be 0 (no limit) or more; got {value}")
        if any(not m or "," in m for m in self.models):
            out.append("--models is a comma-separated list of model names")
        return out

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> KeyRecord:
        raw: dict[str, Any] = orjson.loads(data)
        raw["models"] = tuple(raw.get("models") or ())
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in fields})


def bearer(value: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` value ("" for any other scheme)."""
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def presented_secret(call_headers: dict[str, str], *, anthropic: bool) -> str:
    """The secret a call presents: ``Authorization: Bearer`` (every API; KServe's ``authorization``
    metadata too), or Anthropic's ``x-api-key`` on /v1/messages. "" when none."""
    if anthropic:
        api_key = call_headers.get("x-api-key", "").strip()
        if api_key:
            return api_key
    return bearer(call_headers.get("authorization", ""))

"""``meshfront keys``: create, revoke and list the API keys of a mesh's namespace, and print tenants' usage.

The keys live hashed in NATS (services/gateway/auth/store.py), so this talks to NATS alone: no gateway needs to
be up, and every gateway replica sees a change within a round trip (their watch on the keys bucket). ``create``
prints the new secret as its last line, the only time it is shown; ``list`` and ``revoke`` name keys by their
id (``key_...``), which reveals nothing of the secret; ``revoke`` also takes the secret itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

import nats
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from services.common import namespace
from services.common.jetstream_replicas import nats_servers
from services.gateway.auth.keys import SECRET_PREFIX, KeyRecord, hash_secret, key_id, new_secret
from services.gateway.auth.store import Buckets, open_buckets
from services.gateway.auth.usage import REASONS, summed

CONNECT_TIMEOUT_S = 5.0
# A secret handed in (--secret-env) must be a random one of at least this length (mf- and 43 characters are 46).
MIN_SECRET_CHARS = 32


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, as every meshfront command
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


class Failed(Exception):
    """A command that cannot do what it was asked (exit 1, one line)."""


def _count(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more; got {n}")
    return n


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="meshfront keys", description="API keys of a mesh (meshfront run --auth, the gateways' --auth)")
    env_url = os.environ.get("MESHFRONT_NATS_URL") or os.environ.get("NATS_SERVER") or "nats://127.0.0.1:4222"
    env_ns = os.environ.get("MESHFRONT_NAMESPACE") or os.environ.get("DYN_NAMESPACE") or namespace.DEFAULT
    p.add_argument("--nats-url", default=env_url, help=f"NATS URL [env MESHFRONT_NATS_URL or NATS_SERVER; default "
                                                       f"{env_url!r}]")
    p.add_argument("--namespace", default=env_ns, type=namespace.namespace_name,
                   help=f"the mesh's namespace [env MESHFRONT_NAMESPACE or DYN_NAMESPACE; default {env_ns!r}]")
    # The same two after the command too (`meshfront keys create --nats-url ...`, as users type it); SUPPRESS
    # keeps a subcommand from resetting what was given before it.
    where = _Parser(add_help=False)
    where.add_argument("--nats-url", default=argparse.SUPPRESS, help="as before the command")
    where.add_argument("--namespace", default=argparse.SUPPRESS, type=namespace.namespace_name,
                       help="as before the command")
    sub = p.add_subparsers(dest="command", required=True, metavar="{create,revoke,list,usage}")
    c = sub.add_parser("create", help="a new key; its secret is the last line printed", parents=[where])
    c.add_argument("--tenant", required=True, help="who the key belongs to (usage and fairness are per tenant)")
    c.add_argument("--policy-class", default="", metavar="CLASS[,CLASS...]",
                   help="the key's policy class in the router's queue; a comma list lets its requests pick one with "
                        "the x-dynamo-meta-policy-class header, the first being the key's own (empty: the router's "
                        "default class)")
    c.add_argument("--rpm", type=_count, default=0, help="requests per minute (0: no limit)")
    c.add_argument("--tpm", type=_count, default=0, help="prompt plus completion tokens per minute (0: no limit)")
    c.add_argument("--max-concurrency", type=_count, default=0, help="requests in flight at once (0: no limit)")
    c.add_argument("--models", default="", help="comma-separated models the key may use (empty: every model)")
    c.add_argument("--secret-env", default="", metavar="VAR",
                   help="register the secret in environment variable VAR (a Kubernetes Secret's) instead of a new one: "
                        "a key that exists is left as it is, and one revoked stays revoked, so a rerun changes nothing")
    r = sub.add_parser("revoke", help="revoke a key (its id from `keys list`, or its secret)", parents=[where])
    r.add_argument("key")
    sub.add_parser("list", help="every key's tenant and limits (never the secrets)", parents=[where])
    u = sub.add_parser("usage", help="requests, tokens and rejections per tenant, summed over every gateway",
                       parents=[where])
    u.add_argument("--tenant", default="", help="this tenant only")
    return p


async def _connect(url: str) -> nats.NATS:
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            return await nats.connect(nats_servers(url), name="meshfront-keys", allow_reconnect=False,
                                      connect_timeout=2)
    except (OSError, TimeoutError, nats.errors.Error) as e:
        raise Failed(f"NATS at {url} is not reachable ({e or type(e).__name__})") from None


async def _records(kv: KeyValue) -> dict[str, KeyRecord]:
    """Every key's record by its hash."""
    try:
        digests = await kv.keys()
    except NoKeysError:
        return {}
    out = {}
    for digest in digests:
        try:
            out[digest] = KeyRecord.from_json((await kv.get(digest)).value or b"")
        except KeyNotFoundError:
            continue  # revoked meanwhile
    return out


async def create(b: Buckets, args: argparse.Namespace) -> list[str]:
    secret = os.environ.get(args.secret_env, "") if args.secret_env else new_secret()
    if args.secret_env and len(secret) < MIN_SECRET_CHARS:
        raise Failed(f"${args.secret_env} must hold a secret of at least {MIN_SECRET_CHARS} characters")
    digest = hash_secret(secret)
    record = KeyRecord(key_id(digest), args.tenant, args.policy_class, args.rpm, args.tpm, args.max_concurrency,
                       tuple(m.strip() for m in args.models.split(",")) if args.models else (), round(time.time(), 3))
    errors = record.errors()
    if errors:
        raise Failed("; ".join(errors))
    if args.secret_env:
        try:
            await b.keys.get(digest)
            return [f"{record.key_id} exists; left as it is"]
        except KeyNotFoundError as e:
            if e.op in (KV_DEL, KV_PURGE):  # the tombstone of a revoke: a rerun must not bring the key back
                return [f"{record.key_id} was revoked; it stays revoked"]
    try:
        await b.keys.create(digest, record.to_json())
    except KeyWrongLastSequenceError:  # 2^-256 for a new secret; a --secret-env one created meanwhile
        raise Failed(f"{record.key_id} exists already") from None
    # The secret from --secret-env is not printed: whoever holds the Secret has it.
    return [f"created {record.key_id} for tenant {record.tenant}: {_limits(record)}",
            *(() if args.secret_env else (secret,))]


async def revoke(b: Buckets, args: argparse.Namespace) -> list[str]:
    records = await _records(b.keys)
    if args.key.startswith(SECRET_PREFIX):
        digest = hash_secret(args.key)
        found = records.get(digest)
    else:
        digest, found = next(((d, r) for d, r in records.items() if r.key_id == args.key), ("", None))
    if found is None:
        raise Failed(f"no key {args.key if not args.key.startswith(SECRET_PREFIX) else '(that secret)'} in this "
                     "namespace")
    await b.keys.delete(digest)
    await b.quotas.delete(found.key_id)  # a tombstone where none was: harmless
    return [f"revoked {found.key_id} (tenant {found.tenant})"]


def _limits(r: KeyRecord) -> str:
    return (f"class={r.policy_class or '-'} rpm={r.rpm or '-'} tpm={r.tpm or '-'} "
            f"max_concurrency={r.max_concurrency or '-'} models={','.join(r.models) or '*'}")


async def list_keys(b: Buckets, args: argparse.Namespace) -> list[str]:
    records = sorted((await _records(b.keys)).values(), key=lambda r: (r.tenant, r.created_at))
    return [f"{r.key_id}  tenant={r.tenant}  {_limits(r)}" for r in records] or ["no keys"]


async def usage(b: Buckets, args: argparse.Namespace) -> list[str]:
    try:
        names = await b.usage.keys()
    except NoKeysError:
        names = []
    entries = []
    for name in names:
        if args.tenant and name.partition(".")[0] != args.tenant:
            continue
        try:
            entries.append((name, (await b.usage.get(name)).value or b""))
        except KeyNotFoundError:
            continue
    lines = []
    for tenant, t in sorted(summed(entries).items()):
        rejected = " ".join(f"{reason}={t.rejected[reason]}" for reason in REASONS if t.rejected.get(reason))
        lines.append(f"{tenant}  requests={t.requests} prompt_tokens={t.prompt_tokens} "
                     f"completion_tokens={t.completion_tokens} rejected: {rejected or 'none'}")
    return lines or ["no usage yet"]


COMMANDS = {"create": create, "revoke": revoke, "list": list_keys, "usage": usage}


async def run(args: argparse.Namespace) -> list[str]:
    nc = await _connect(args.nats_url)
    try:
        buckets = await open_buckets(nc.jetstream(timeout=CONNECT_TIMEOUT_S), namespace.Namespace.of(args.namespace))
        return await COMMANDS[args.command](buckets, args)
    finally:
        await nc.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        lines = asyncio.run(run(args))
    except Failed as e:
        print(f"meshfront keys {args.command}: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0

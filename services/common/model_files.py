"""A model's tokenizer, template and config files, shared through NATS so that no stage but the worker needs them.

A worker that registers publishes the small files the stages read (``STAGE_FILES``: the tokenizer, its
config, the chat template, the model's config) to the JetStream Object Store ``meshfront_model_files_<namespace>``
(its ``--namespace``'s: services/common/namespace.py), content-addressed: each file is an object named by the
SHA-256 of its bytes, and a manifest (name -> digest of each file) is an object named by the SHA-256 of its own
canonical JSON. The card carries where that manifest is (``ModelCard.model_files``, a reference
``<namespace>/<digest>``: a stage may see several namespaces' workers, and the postprocessor is handed the
reference alone, in a request's options); the preprocessor and postprocessor, which used to open the card's
``model_dir`` on their own disk (a volume shared with the workers), now turn the digest into a directory
of their own (``ModelFilesResolver``):

- the card's ``model_dir`` when it exists here and holds exactly those files (one machine: no copy);
- else ``<cache>/<digest>``, fetched once from the Object Store, each file checked against its digest,
  written to a temporary directory and renamed into place whole, so a crash never leaves half a model.

Content addressing makes every step idempotent: two workers of one model publish the same objects (the
second finds them there), a cache directory never goes stale (other files give another digest), and a
frontend on another host needs nothing but NATS. Weights are not published: only workers read them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import nats
from nats.js.api import ObjectStoreConfig
from nats.js.errors import ObjectNotFoundError

from services.common.jetstream_replicas import open_or_create
from services.common.namespace import DEFAULT_NAMESPACE, Namespace
from services.common.nats_connection import close_nats, connect_retrying
from services.common.tokenizer_files import has_tokenizer, tokenizer_files

log = logging.getLogger(__name__)

BUCKET = "meshfront_model_files"  # then _<namespace>
# What the stages read from a model directory (services/preprocessor/core/artifacts.py, the postprocessor's
# tokenizer, the engines' parser backends through transformers' tokenizer loading).
# Besides these fixed names, a directory's ``*.tiktoken`` ranks file and the modules of its auto_map tokenizer
# classes (tokenizer_files.tokenizer_files: a class --trust-remote-code runs must be there to run).
STAGE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
               "chat_template.jinja", "chat_template.json", "config.json", "generation_config.json",
               "vocab.json", "merges.txt", "tokenizer.model", "tiktoken.model")
# The names those extra files may have: a manifest's names become paths, so never a path, never a dotfile.
_EXTRA_FILE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.py|[A-Za-z0-9_][A-Za-z0-9_.-]*\.tiktoken")
_MANIFEST_VERSION = 1


class ModelFilesUnavailable(RuntimeError):
    """The manifest or one of its files is not in the Object Store (or NATS cannot be reached)."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_stage_files(model_dir: str | Path) -> dict[str, bytes]:
    """The ``STAGE_FILES`` that ``model_dir`` has, by name."""
    root = Path(model_dir)
    names = [*STAGE_FILES, *tokenizer_files(root)]
    return {name: (root / name).read_bytes() for name in names if (root / name).is_file()}


def is_stage_file(name: str) -> bool:
    """A fixed stage file's name, or one a tokenizer's extra files may have."""
    return name in STAGE_FILES or _EXTRA_FILE.fullmatch(name) is not None


def manifest_bytes(files: Mapping[str, bytes]) -> bytes:
    """The canonical manifest of ``files``: sorted keys, no spaces, so one set of files has one digest."""
    entries = {name: {"sha256": _sha256(data), "size": len(data)} for name, data in files.items()}
    return json.dumps({"version": _MANIFEST_VERSION, "files": entries}, sort_keys=True,
                      separators=(",", ":")).encode()


def model_files_digest(model_dir: str | Path) -> str:
    """The digest a card carries for ``model_dir``; empty when it has none of the files (a media model)."""
    return _sha256(manifest_bytes(read_stage_files(model_dir))) if has_tokenizer(model_dir) else ""


def reference(namespace: Namespace, digest: str) -> str:
    """What a card carries for files of manifest ``digest`` published in ``namespace``; empty: none."""
    return f"{namespace.name}/{digest}" if digest else ""


def model_files_reference(namespace: Namespace, model_dir: str | Path) -> str:
    """The reference a card of a worker in ``namespace`` carries for ``model_dir``'s files."""
    return reference(namespace, model_files_digest(model_dir))


def split_reference(ref: str) -> tuple[Namespace, str]:
    """(namespace, manifest digest) of a card's reference; a bare digest (a card written before namespaces)
    is the default namespace's.

    Raises:
        ModelFilesUnavailable: the namespace part is not a namespace name."""
    name, slash, digest = ref.rpartition("/")
    try:
        return (Namespace(name) if slash else DEFAULT_NAMESPACE), digest
    except ValueError as e:
        raise ModelFilesUnavailable(f"model files reference {ref!r}: {e}") from None


def parse_manifest(raw: bytes, digest: str) -> dict[str, str]:
    """File name -> SHA-256 from a manifest fetched by ``digest``, checked against it."""
    if _sha256(raw) != digest:
        raise ModelFilesUnavailable(f"the manifest stored as {digest} does not have that digest")
    doc = json.loads(raw)
    if doc.get("version") != _MANIFEST_VERSION:
        raise ModelFilesUnavailable(f"manifest {digest} has version {doc.get('version')!r}, not {_MANIFEST_VERSION}")
    names = doc["files"]
    for name in names:  # names become paths: only the known file names, never a path
        if not is_stage_file(name):
            raise ModelFilesUnavailable(f"manifest {digest} names {name!r}, which is not a model file")
    return {name: entry["sha256"] for name, entry in names.items()}


async def _object_store(js: nats.js.JetStreamContext, namespace: Namespace):
    bucket = namespace.bucket(BUCKET)
    return await open_or_create(lambda: js.object_store(bucket), lambda replicas: js.create_object_store(
        bucket, ObjectStoreConfig(
            description="Model tokenizer, template and config files, content-addressed (docs/architecture.md)",
            replicas=replicas)))


async def publish(js: nats.js.JetStreamContext, model_dir: str | Path, namespace: Namespace) -> str:
    """Stores ``model_dir``'s stage files and their manifest in ``namespace``'s store (objects already there are
    kept); returns the reference to them, which equals ``model_files_reference(namespace, model_dir)``."""
    files = read_stage_files(model_dir)
    manifest = manifest_bytes(files)
    digest = _sha256(manifest)
    store = await _object_store(js, namespace)
    for data in (*files.values(), manifest):
        name = _sha256(data)
        try:
            await store.get_info(name)
            continue
        except ObjectNotFoundError:
            pass
        await store.put(name, data)
    return reference(namespace, digest)


async def fetch(js: nats.js.JetStreamContext, ref: str) -> dict[str, bytes]:
    """The files a card's reference names, each checked against its SHA-256."""
    namespace, digest = split_reference(ref)
    store = await _object_store(js, namespace)
    try:
        manifest = parse_manifest((await store.get(digest)).data or b"", digest)
        files = {}
        for name, sha in manifest.items():
            data = (await store.get(sha)).data or b""
            if _sha256(data) != sha:
                raise ModelFilesUnavailable(f"{name} of model files {digest} does not match its digest")
            files[name] = data
    except ObjectNotFoundError as e:
        raise ModelFilesUnavailable(f"model files {digest} are not in the {namespace.bucket(BUCKET)} object store "
                                    f"({e})") from None
    return files


def write_whole(cache_root: Path, digest: str, files: Mapping[str, bytes]) -> Path:
    """``files`` as ``cache_root/digest``, renamed into place only once every file is written."""
    target = cache_root / digest
    if target.is_dir():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=cache_root))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():  # not another process that got there first
            raise
    return target


def default_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meshfront" / "model-files"


class ModelFilesResolver:
    """Turns a card's (``model_dir``, ``model_files``) into a directory on this host, once per digest.

    ``model_files`` is the card's reference (``<namespace>/<digest>``, see ``reference``): the files are fetched
    from that namespace's store, whichever namespace this stage lives in."""

    def __init__(self, nats_url: str, cache_root: Path | None = None, *, timeout_s: float = 30.0):
        self.nats_url = nats_url
        self.cache_root = cache_root or default_cache_root()
        self.timeout_s = timeout_s
        self._resolved: dict[tuple[str, str], str] = {}
        self._lock = asyncio.Lock()
        self._nc: nats.NATS | None = None

    def peek(self, model_dir: str, digest: str) -> str | None:
        """The directory already resolved for this pair, without waiting."""
        return model_dir if not digest else self._resolved.get((model_dir, digest))

    async def local_dir(self, model_dir: str, digest: str) -> str:
        """A directory holding the files of reference ``digest`` (``model_dir`` itself for a card without one).

        Raises:
            ModelFilesUnavailable: the files are neither here nor in the Object Store."""
        found = self.peek(model_dir, digest)
        if found is not None:
            return found
        async with self._lock:  # one fetch per digest however many requests wait for it
            found = self._resolved.get((model_dir, digest))
            if found is None:
                found = self._resolved[(model_dir, digest)] = await self._resolve(model_dir, digest)
            return found

    async def _resolve(self, model_dir: str, ref: str) -> str:
        digest = split_reference(ref)[1]
        if model_dir and await asyncio.to_thread(model_files_digest, model_dir) == digest:
            return model_dir  # the worker's own directory is here (one machine, or a shared volume)
        cached = self.cache_root / digest
        if cached.is_dir():
            return str(cached)
        log.info("fetching model files %s (%s) from NATS", digest[:12], model_dir)
        try:
            async with asyncio.timeout(self.timeout_s):
                files = await fetch(await self._jetstream(), ref)
        except (TimeoutError, nats.errors.Error) as e:
            raise ModelFilesUnavailable(f"cannot fetch model files {digest} from NATS ({e or type(e).__name__})") \
                from None
        return str(await asyncio.to_thread(write_whole, self.cache_root, digest, files))

    async def _jetstream(self) -> nats.js.JetStreamContext:
        if self._nc is None:
            async with asyncio.timeout(self.timeout_s):
                self._nc = await connect_retrying(self.nats_url, "model-files")
        return self._nc.jetstream(timeout=self.timeout_s)

    async def close(self) -> None:
        if self._nc is not None:
            await close_nats(self._nc)
            self._nc = None

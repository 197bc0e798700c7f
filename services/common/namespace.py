"""Namespaces: several meshes on one NATS, each seeing only its own workers, events and stored objects.

A namespace is Dynamo's ``DYN_NAMESPACE`` (``--namespace``): a name of 1-64 characters from
``[A-Za-z0-9_-]``, ``dynamo`` by default. Everything a mesh keeps in NATS is named after it (``Namespace``):

- worker registrations share ONE bucket (``meshfront_workers``) under keys ``<namespace>.<worker_id>``, so
  that a service watching one namespace asks NATS for ``<namespace>.>`` and hears nothing of the others
  (one watch, event-driven, no polling of per-namespace buckets); the card carries its namespace too;
- stored objects (responses, video jobs, media, media uuids, model files) live in a bucket or stream of
  their own per namespace (``meshfront_responses_<namespace>``): the other namespaces' objects are not
  even listable;
- events carry the namespace as a subject token (``meshfront.kv.events.<namespace>.<model>.<worker>``,
  ``meshfront.router.lifecycle.<namespace>``), so that a subscriber of one namespace is sent nothing else.

Which workers a frontend stage sees is Dynamo's discovery rule (``DiscoveryFilter``): ``--namespace-prefix``
(a prefix match) wins over ``--namespace`` (an exact match), and an empty ``--namespace`` or the literal
``dynamo`` means no filtering: every namespace's workers. A stage's own stores and subjects always live in its
``--namespace`` (``dynamo`` when empty). Workers register in their ``--namespace``.

Pure: no NATS here, only names.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

DEFAULT = "dynamo"
MAX_LENGTH = 64
_NAME = re.compile(r"[A-Za-z0-9_-]+")
# Subject tokens and key prefixes that mean "every namespace" (NATS's full wildcard).
ALL_KEYS = ">"


def name_error(value: str, flag: str = "--namespace") -> str:
    """Why ``value`` is not a namespace name (one line), or "" when it is one."""
    if not value or len(value) > MAX_LENGTH or not _NAME.fullmatch(value):
        return (f"{flag} {value!r} is not a namespace: 1 to {MAX_LENGTH} characters of letters, digits, "
                "'_' and '-'")
    return ""


@dataclasses.dataclass(frozen=True)
class Namespace:
    """One mesh's scope in NATS; each method names one bucket, stream or subject of it.

    Raises ValueError (one line) for a name outside ``[A-Za-z0-9_-]{1,64}``: it becomes part of NATS subjects
    and stream names, where a '.' would split a token and '*' or '>' would be a wildcard.
    """

    name: str = DEFAULT

    def __post_init__(self) -> None:
        error = name_error(self.name)
        if error:
            raise ValueError(error)

    @classmethod
    def of(cls, flag_value: str) -> Namespace:
        """The namespace a ``--namespace`` value names: an empty one is the default (``dynamo``)."""
        return cls(flag_value or DEFAULT)

    def bucket(self, base: str) -> str:
        """A bucket or stream of this namespace's own: ``meshfront_responses`` -> ``meshfront_responses_<name>``."""
        return f"{base}_{self.name}"

    def subject(self, base: str) -> str:
        """A subject (or subject prefix) of this namespace: ``meshfront.kv.dump`` -> ``meshfront.kv.dump.<name>``."""
        return f"{base}.{self.name}"

    def worker_key(self, worker_id: str) -> str:
        """A worker's key in the shared registration bucket."""
        return f"{self.name}.{worker_id}"


DEFAULT_NAMESPACE = Namespace(DEFAULT)


def split_worker_key(key: str) -> tuple[str, str]:
    """(namespace, worker id) of a registration key; a key without a namespace (a card written before
    namespaces) is the default namespace's."""
    namespace, dot, worker_id = key.partition(".")
    return (namespace, worker_id) if dot else (DEFAULT, key)


@dataclasses.dataclass(frozen=True)
class DiscoveryFilter:
    """Which namespaces' workers a frontend stage sees (Dynamo's rule, in the module docstring).

    ``namespace`` and ``prefix`` are the raw ``--namespace`` and ``--namespace-prefix`` values (empty: unset).
    """

    namespace: str = DEFAULT
    prefix: str = ""

    def __post_init__(self) -> None:
        if self.namespace:
            Namespace(self.namespace)  # validates
        if self.prefix and name_error(self.prefix, "--namespace-prefix"):
            raise ValueError(name_error(self.prefix, "--namespace-prefix"))

    @property
    def exact(self) -> str | None:
        """The one namespace seen, when the filter is an exact match; None for a prefix or no filtering."""
        if self.prefix or not self.namespace or self.namespace == DEFAULT:
            return None
        return self.namespace

    def admits(self, namespace: str) -> bool:
        """Whether a worker registered in ``namespace`` is seen."""
        if self.prefix:
            return namespace.startswith(self.prefix)
        exact = self.exact
        return exact is None or namespace == exact

    @property
    def keys(self) -> str:
        """The registration keys to watch: only the namespace's when exact, else all (a prefix of a token is
        not a NATS wildcard, so a prefix filter watches all and drops the rest with ``admits``)."""
        exact = self.exact
        return ALL_KEYS if exact is None else f"{exact}.{ALL_KEYS}"

    def subjects(self, base: str) -> str:
        """The subscription to ``base``'s per-namespace subjects that this filter needs (``<base>.<ns>.>`` or
        ``<base>.>``)."""
        exact = self.exact
        return f"{base}.{ALL_KEYS}" if exact is None else f"{base}.{exact}.{ALL_KEYS}"


EVERY_NAMESPACE = DiscoveryFilter(DEFAULT)


def namespace_name(value: str) -> str:
    """argparse ``type`` of ``--namespace``: the value, or one line saying why it is not a name (empty is
    allowed: no discovery filter, and the default namespace for the stage's own stores)."""
    if value and name_error(value):
        raise argparse.ArgumentTypeError(name_error(value))
    return value


def namespace_prefix(value: str) -> str:
    """argparse ``type`` of ``--namespace-prefix`` (empty: unset). An env twin's bad value reads "invalid
    namespace_prefix value", as argparse names a ``type`` by its function."""
    if value and name_error(value, "--namespace-prefix"):
        raise argparse.ArgumentTypeError(name_error(value, "--namespace-prefix"))
    return value

"""Policy classes: the router queue's weighted classes, declared by Dynamo's ``--router-policy-config`` YAML.

A class has a name, a weight (Dynamo's ``quantum``: a class of quantum 4 is served four times the uncached
prompt tokens of a class of quantum 1 while both wait) and its own order within (``queue_policy``: fcfs or
wspt, core/wait_queue.py). A request names the class it wants (``RouteRequest.policy_class``: the gateway
puts there its key's class, or the ``x-dynamo-meta-policy-class`` header the key allows); a name no class
has, or none, gets the default class, as Dynamo maps an unknown requested policy to its default family. A
batch line (``RouteRequest.batch``) runs in the lowest class: the least weight, the last declared of equals.

Without ``--router-policy-config`` there is one class, ``default``, in ``--router-queue-policy`` order
(Dynamo's synthetic class): tenants still share it fairly.

Dynamo's file (lib/kv-router/src/scheduling/policy_config.rs) maps a requested policy *family* and the
request's uncached prompt length (``uncached_isl_buckets``) to a class. The subset read here is the one that
means classes, weights and per-class order: one bucket starting at 0 tokens, so each family is one class;
classes selected by family or by name. Everything else (more buckets, per-model profiles, worker_selection,
per-class busy thresholds and queue limits) is refused with one line naming the key and what to use instead.

```yaml
default_policy_family: standard
uncached_isl_buckets: [{min_tokens: 0, bucket: all}]
policy_classes:
  - {name: premium, policy_family: premium, cache_bucket: all, quantum: 4}
  - {name: standard, policy_family: standard, cache_bucket: all, quantum: 1, queue_policy: wspt}
```
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

FCFS, WSPT = "fcfs", "wspt"
QUEUE_POLICIES = (FCFS, WSPT)
SYNTHETIC = "default"  # Dynamo's name for the one class a router without a policy config has
_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # Dynamo's validate_identifier
# What Dynamo's file may hold that Meshfront does not build, and what to use instead.
_REFUSED_TOP = {
    "models": "per-model profiles are not built; one profile serves every model",
    "worker_selection": "named worker-selection instances are not built; --router-mode chooses workers",
}
_QUEUE_FLAGS = "--router-queue-threshold, the busy thresholds and --queue-timeout-s, which hold for every class"
_REFUSED_CLASS = {
    "prefill_busy_threshold": _QUEUE_FLAGS, "prefill_busy_threshold_frac": _QUEUE_FLAGS,
    "busy_worker_ratio": _QUEUE_FLAGS, "request_queue_limit_per_worker": _QUEUE_FLAGS,
    "raw_isl_token_queue_limit_per_worker": _QUEUE_FLAGS, "cached_token_queue_limit_per_worker": _QUEUE_FLAGS,
}
_CLASS_KEYS = {"name", "policy_family", "cache_bucket", "queue_policy", "quantum"}


class PolicyConfigError(ValueError):
    """A policy config Meshfront cannot honour; the message is one line naming the file's key."""


@dataclasses.dataclass(frozen=True)
class PolicyClass:
    name: str
    weight: int = 1  # Dynamo's quantum
    queue_policy: str = FCFS


@dataclasses.dataclass(frozen=True)
class PolicyClasses:
    """The router's classes (declared order), the default one's name, and the family names that select them."""

    classes: tuple[PolicyClass, ...]
    default: str
    families: Mapping[str, str] = dataclasses.field(default_factory=dict)  # family -> class name

    @classmethod
    def synthetic(cls, queue_policy: str = FCFS) -> PolicyClasses:
        return cls((PolicyClass(SYNTHETIC, 1, queue_policy),), SYNTHETIC)

    @classmethod
    def of_weights(cls, weights: Sequence[tuple[str, int]], default: str = "") -> PolicyClasses:
        """Classes of these weights (fcfs each); the default is ``default``, else the lowest-weight class."""
        classes = tuple(PolicyClass(name, weight) for name, weight in weights)
        out = cls(classes, default or "")
        return dataclasses.replace(out, default=default or out.lowest.name)

    @property
    def lowest(self) -> PolicyClass:
        """The batch lines' class: the least weight; the last declared among equals."""
        return min(reversed(self.classes), key=lambda c: c.weight)

    def named(self, name: str) -> PolicyClass | None:
        return next((c for c in self.classes if c.name == name), None)

    def resolve(self, requested: str, batch: bool = False) -> PolicyClass:
        """The class a request runs in: a batch line's is the lowest; else the class or family it names, and the
        default class for a name none has (or none)."""
        if batch:
            return self.lowest
        found = self.named(requested) or self.named(self.families.get(requested, ""))
        return found or self.named(self.default) or self.classes[0]


def load(path: str, fallback_policy: str = FCFS) -> PolicyClasses:
    """The classes of ``--router-policy-config`` (a YAML file), or the synthetic class when ``path`` is empty.
    Raises PolicyConfigError (one line) for a file that cannot be read or holds what is not built."""
    if not path:
        return PolicyClasses.synthetic(fallback_policy)
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise PolicyConfigError(f"--router-policy-config {path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise PolicyConfigError(f"--router-policy-config {path}: not YAML ({' '.join(str(e).split())})") from None
    return parse(raw, where=f"--router-policy-config {path}")


def parse(raw: Any, where: str = "--router-policy-config") -> PolicyClasses:
    """The classes of a parsed policy config document (Dynamo's root profile, the subset above)."""
    if not isinstance(raw, dict):
        raise PolicyConfigError(f"{where}: expected a mapping with default_policy_family, uncached_isl_buckets "
                                "and policy_classes")
    for key, why in _REFUSED_TOP.items():
        if key in raw:
            raise PolicyConfigError(f"{where}: {key}: {why}")
    unknown = sorted(set(raw) - {"default_policy_family", "uncached_isl_buckets", "policy_classes"})
    if unknown:
        raise PolicyConfigError(f"{where}: unknown key {unknown[0]!r}")
    missing = [k for k in ("default_policy_family", "uncached_isl_buckets", "policy_classes") if k not in raw]
    if missing:
        raise PolicyConfigError(f"{where}: the root profile needs default_policy_family, uncached_isl_buckets and "
                                f"policy_classes together (missing {', '.join(missing)})")
    bucket = _one_bucket(raw["uncached_isl_buckets"], where)
    entries = raw["policy_classes"]
    if not isinstance(entries, list) or not entries:
        raise PolicyConfigError(f"{where}: policy_classes must be a non-empty list")
    classes: list[PolicyClass] = []
    families: dict[str, str] = {}
    for entry in entries:
        cls, family = _class(entry, bucket, where)
        if any(c.name == cls.name for c in classes):
            raise PolicyConfigError(f"{where}: duplicate policy class {cls.name!r}")
        if family is not None:
            if family in families:
                raise PolicyConfigError(f"{where}: two classes for family {family!r} and bucket {bucket!r} (one "
                                        "bucket: one class per family)")
            families[family] = cls.name
        classes.append(cls)
    default_family = raw["default_policy_family"]
    if default_family not in families:
        raise PolicyConfigError(f"{where}: default_policy_family {default_family!r} names no class's policy_family")
    return PolicyClasses(tuple(classes), families[default_family], families)


def _one_bucket(buckets: Any, where: str) -> str:
    if not isinstance(buckets, list) or not buckets or not all(isinstance(b, dict) for b in buckets):
        raise PolicyConfigError(f"{where}: uncached_isl_buckets must be a non-empty list of {{min_tokens, bucket}}")
    if len(buckets) > 1:
        raise PolicyConfigError(f"{where}: uncached_isl_buckets: classes by uncached prompt length are not built; "
                                "give one bucket at min_tokens 0 (a class per family)")
    only = buckets[0]
    if only.get("min_tokens") != 0 or not _NAME.fullmatch(str(only.get("bucket", ""))) or set(only) - {
            "min_tokens", "bucket"}:
        raise PolicyConfigError(f"{where}: uncached_isl_buckets: the one bucket is {{min_tokens: 0, bucket: NAME}}")
    return str(only["bucket"])


def _class(entry: Any, bucket: str, where: str) -> tuple[PolicyClass, str | None]:
    if not isinstance(entry, dict):
        raise PolicyConfigError(f"{where}: each policy_classes entry is a mapping")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PolicyConfigError(f"{where}: policy class name {name!r} must match [A-Za-z0-9_.-]+")
    for key in entry:
        if key in _REFUSED_CLASS:
            raise PolicyConfigError(f"{where}: policy class {name!r}: {key} is not built per class; use "
                                    f"{_REFUSED_CLASS[key]}")
        if key not in _CLASS_KEYS:
            raise PolicyConfigError(f"{where}: policy class {name!r}: unknown key {key!r}")
    quantum = entry.get("quantum")
    if isinstance(quantum, bool) or not isinstance(quantum, int) or quantum <= 0:
        raise PolicyConfigError(f"{where}: policy class {name!r}: quantum must be an integer greater than zero")
    policy = entry.get("queue_policy", FCFS)
    if policy not in QUEUE_POLICIES:
        raise PolicyConfigError(f"{where}: policy class {name!r}: queue_policy must be fcfs or wspt")
    family, cache_bucket = entry.get("policy_family"), entry.get("cache_bucket")
    if (family is None) != (cache_bucket is None):
        raise PolicyConfigError(f"{where}: policy class {name!r}: give both policy_family and cache_bucket, or "
                                "neither (a class selected by its name only)")
    if family is not None and (not isinstance(family, str) or not _NAME.fullmatch(family)):
        raise PolicyConfigError(f"{where}: policy class {name!r}: policy_family must match [A-Za-z0-9_.-]+")
    if cache_bucket is not None and cache_bucket != bucket:
        raise PolicyConfigError(f"{where}: policy class {name!r} references unknown cache bucket {cache_bucket!r}")
    return PolicyClass(name, quantum, policy), family


def weights_yaml(weights: Sequence[tuple[str, int]]) -> str:
    """The policy config of ``meshfront run --policy-class NAME=WEIGHT ...``: one family per class, the
    lowest-weight class the default (a request that names no class never outranks one that does)."""
    default = PolicyClasses.of_weights(weights).default
    doc = {"default_policy_family": default, "uncached_isl_buckets": [{"min_tokens": 0, "bucket": "all"}],
           "policy_classes": [{"name": n, "policy_family": n, "cache_bucket": "all", "quantum": w}
                              for n, w in weights]}
    return yaml.safe_dump(doc, sort_keys=False)


def parse_weight(text: str) -> tuple[str, int]:
    """``NAME=WEIGHT`` of ``--policy-class`` (ValueError naming the flag)."""
    name, sep, weight = text.partition("=")
    if not sep or not _NAME.fullmatch(name) or not weight.isdigit() or int(weight) <= 0:
        raise ValueError(f"--policy-class {text!r} is not NAME=WEIGHT (a name of letters, digits, '_', '.', '-' "
                         "and a whole weight > 0, e.g. premium=4)")
    return name, int(weight)

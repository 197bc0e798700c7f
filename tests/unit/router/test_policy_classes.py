"""Policy classes in the router queue: weighted shares between classes, turns between tenants, which class a
request runs in, and Dynamo's --router-policy-config (the subset built, the rest refused in one line)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import ModelCard, WorkerCard
from services.common.errors import Overloaded
from services.common.overload import BusyThreshold
from services.router import config as router_config
from services.router.core import policy_classes
from services.router.core.policy_classes import PolicyClasses, PolicyConfigError
from services.router.core.wait_queue import WaitQueue
from services.router.service import Router

pytestmark = pytest.mark.unit

PREMIUM_STANDARD = PolicyClasses.of_weights([("premium", 4), ("standard", 1)])


class Slots:
    """A route function with ``free`` slots: each routed request takes one, then Overloaded."""

    def __init__(self) -> None:
        self.free = 0
        self.served: list[str] = []

    def __call__(self, request: str) -> str:
        if self.free <= 0:
            raise Overloaded("busy")
        self.free -= 1
        self.served.append(request)
        return request


def drain_one_at_a_time(q: WaitQueue[str], slots: Slots, steps: int,
                        after: Callable[[str], None] = lambda rid: None) -> list[str]:
    """Frees one slot ``steps`` times (one request ends each time), draining after each; ``after`` sees each
    request served (a client that sends its next one)."""
    for _ in range(steps):
        slots.free += 1
        before = len(slots.served)
        q.drain("m", slots)
        for rid in slots.served[before:]:
            after(rid)
    return slots.served


def test_two_flooding_classes_of_weights_4_and_1_are_served_4_to_1():
    async def main() -> collections.Counter[str]:
        q: WaitQueue[str] = WaitQueue(classes=PREMIUM_STANDARD)
        for i in range(200):  # both flood: more waiting than will be served
            q.push("m", f"premium-{i}", new_tokens=100, policy_class="premium", tenant="p")
            q.push("m", f"standard-{i}", new_tokens=100, policy_class="standard", tenant="s")
        served = drain_one_at_a_time(q, Slots(), 100)
        return collections.Counter(rid.split("-")[0] for rid in served)

    shares = asyncio.run(main())
    assert shares == {"premium": 80, "standard": 20}


def test_weights_share_prompt_tokens_not_requests():
    # Equal weights: a class of 400-token prompts gets a quarter of the requests of one of 100-token prompts.
    async def main() -> collections.Counter[str]:
        q: WaitQueue[str] = WaitQueue(classes=PolicyClasses.of_weights([("a", 1), ("b", 1)]))
        for i in range(200):
            q.push("m", f"long-{i}", new_tokens=400, policy_class="a", tenant="t1")
            q.push("m", f"short-{i}", new_tokens=100, policy_class="b", tenant="t2")
        return collections.Counter(rid.split("-")[0] for rid in drain_one_at_a_time(q, Slots(), 100))

    assert asyncio.run(main()) == {"long": 20, "short": 80}


def test_a_tenant_sending_two_at_a_time_is_not_held_back_by_a_flood_of_48_in_its_class():
    async def main(light_tenant: str) -> tuple[list[int], int]:
        q: WaitQueue[str] = WaitQueue()
        flood = iter(range(10_000))
        waits, sent = [], {"light": 0}

        def refill(rid: str) -> None:  # every client sends its next request when one is served
            if rid.startswith("flood"):
                q.push("m", f"flood-{next(flood)}", new_tokens=50, tenant="flood")
            else:
                waits.append(len(slots.served) - sent.pop(rid))
                light(len(slots.served))

        def light(now: int) -> None:
            rid = f"light-{sent['light']}"
            sent["light"] += 1
            sent[rid] = now
            q.push("m", rid, new_tokens=50, tenant=light_tenant)

        for _ in range(48):
            q.push("m", f"flood-{next(flood)}", new_tokens=50, tenant="flood")
        slots = Slots()
        light(0)
        light(0)  # two at a time
        drain_one_at_a_time(q, slots, 200, refill)
        return waits, q.waiting("m")

    waits, still_waiting = asyncio.run(main("light"))
    # A light request waits for its other one and a flood request each (4 slots), never for the 48 ...
    assert len(waits) >= 60 and max(waits) <= 4
    assert still_waiting == 48 + 2
    # ... as it would as part of the flood's tenant (arrival order within one tenant).
    waits, _ = asyncio.run(main("flood"))
    assert min(waits[2:]) >= 48


def test_a_class_back_from_idle_gets_no_saved_credit():
    async def main() -> list[str]:
        q: WaitQueue[str] = WaitQueue(classes=PREMIUM_STANDARD)
        for i in range(100):
            q.push("m", f"standard-{i}", new_tokens=10, policy_class="standard", tenant="s")
        slots = Slots()
        drain_one_at_a_time(q, slots, 30)  # premium idle meanwhile: standard has had everything
        for i in range(100):
            q.push("m", f"premium-{i}", new_tokens=10, policy_class="premium", tenant="p")
        return drain_one_at_a_time(q, slots, 50)[30:]

    after = asyncio.run(main())
    # Served at once (the next request), then 4:1 from there on: never 30 premium in a row to catch up (at
    # most 5: it starts at the virtual time of the request in service, a quarter-step before standard's next).
    assert after[0].startswith("premium")
    runs = "".join(rid[0] for rid in after).split("s")
    assert max(len(run) for run in runs) <= 5
    assert collections.Counter(rid.split("-")[0] for rid in after)["standard"] >= 9


def test_class_of_a_request_unknown_or_empty_is_the_default_and_batch_lines_run_in_the_lowest():
    classes = PolicyClasses.of_weights([("gold", 8), ("silver", 2), ("bronze", 2)])
    assert classes.default == "bronze"  # the lowest weight (the last declared of equals) unless named
    assert classes.resolve("gold").name == "gold"
    assert classes.resolve("").name == classes.resolve("platinum").name == "bronze"
    assert classes.resolve("gold", batch=True).name == "bronze"
    named = PolicyClasses.of_weights([("gold", 8), ("silver", 2)], default="gold")
    assert named.resolve("nope").name == "gold" and named.lowest.name == "silver"


def test_a_tenants_batch_lines_are_a_flow_apart_from_its_own_requests():
    async def main() -> list[str]:
        q: WaitQueue[str] = WaitQueue(classes=PREMIUM_STANDARD)
        for i in range(20):
            q.push("m", f"batch-{i}", new_tokens=10, policy_class="premium", tenant="acme", batch=True)
        q.push("m", "chat-0", new_tokens=10, policy_class="standard", tenant="acme")
        q.push("m", "chat-1", new_tokens=10, policy_class="standard", tenant="acme")
        return drain_one_at_a_time(q, Slots(), 4)

    served = asyncio.run(main())
    # The batch asked for premium but runs in standard (the lowest), taking turns with the tenant's chat there.
    assert served == ["batch-0", "chat-0", "batch-1", "chat-1"]


def test_within_a_tenant_each_class_keeps_its_own_queue_policy():
    classes = policy_classes.parse({
        "default_policy_family": "fast", "uncached_isl_buckets": [{"min_tokens": 0, "bucket": "all"}],
        "policy_classes": [{"name": "fast", "policy_family": "fast", "cache_bucket": "all", "quantum": 1,
                            "queue_policy": "wspt"}]})

    async def main(classes: PolicyClasses | None) -> list[str]:
        q: WaitQueue[str] = WaitQueue(classes=classes)
        for rid, tokens, jump in (("long", 4000, 0.0), ("short", 100, 0.0), ("urgent-long", 4000, 99.0)):
            q.push("m", rid, jump, tokens, tenant="t")
        slots = Slots()
        slots.free = 3
        q.drain("m", slots)
        return slots.served

    assert asyncio.run(main(classes)) == ["urgent-long", "short", "long"]  # wspt
    assert asyncio.run(main(None)) == ["urgent-long", "long", "short"]  # fcfs with the priority jump


def test_abandoned_waiters_neither_count_nor_take_a_slot():
    async def main() -> tuple[int, list[str]]:
        q: WaitQueue[str] = WaitQueue(classes=PREMIUM_STANDARD)
        gone = q.push("m", "gone", policy_class="premium", tenant="p")
        q.push("m", "kept", policy_class="standard", tenant="s")
        gone.cancel()
        slots = Slots()
        slots.free = 2
        waiting = q.waiting("m")
        q.drain("m", slots)
        return waiting, slots.served

    assert asyncio.run(main()) == (1, ["kept"])


def test_the_router_queues_by_the_route_requests_class_and_tenant():
    cards = [WorkerCard("w0", "127.0.0.1:9000", ModelCard("m", "/tmp"))]

    async def main() -> list[str]:
        router = Router(lambda model: cards, busy=BusyThreshold(1), queue_timeout_s=5)
        router.queue = WaitQueue(classes=PREMIUM_STANDARD)
        await router.route(router_pb2.RouteRequest(request_id="first", model="m", prompt_tokens=8))
        order: list[str] = []

        async def send(rid: str, **kw) -> None:
            await router.route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=8, **kw))
            order.append(rid)
            await router.release(router_pb2.ReleaseRequest(request_id=rid))

        tasks = [asyncio.ensure_future(send(f"s{i}", policy_class="standard", tenant="b")) for i in range(5)]
        tasks += [asyncio.ensure_future(send(f"p{i}", policy_class="premium", tenant="a")) for i in range(5)]
        await asyncio.sleep(0)
        assert router.queue.waiting("m") == 10
        await router.release(router_pb2.ReleaseRequest(request_id="first"))
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return order

    # Equal prompts: 4 premium per standard while both wait (ties go to the class declared first).
    assert asyncio.run(main()) == ["p0", "s0", "p1", "p2", "p3", "p4", "s1", "s2", "s3", "s4"]


YAML = """
default_policy_family: standard
uncached_isl_buckets:
  - {min_tokens: 0, bucket: all}
policy_classes:
  - {name: premium, policy_family: premium, cache_bucket: all, quantum: 4}
  - {name: standard, policy_family: standard, cache_bucket: all, quantum: 1, queue_policy: wspt}
  - {name: vip, quantum: 16}
"""


def test_dynamos_policy_config_is_read_through_the_flag_and_its_env_twin(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(YAML)
    for cfg in (router_config.parse_config(["--router-policy-config", str(path)], {}),
                router_config.parse_config([], {"DYN_ROUTER_POLICY_CONFIG": str(path)})):
        classes = cfg.policy_classes
        assert [(c.name, c.weight, c.queue_policy) for c in classes.classes] == \
            [("premium", 4, "fcfs"), ("standard", 1, "wspt"), ("vip", 16, "fcfs")]
        assert classes.default == "standard"
        assert classes.resolve("vip").name == "vip"  # an explicit class: chosen by its name
    assert router_config.parse_config([], {}).policy_classes.classes[0].name == "default"


def test_meshfront_runs_weights_are_written_as_dynamos_file_and_read_back():
    weights = [policy_classes.parse_weight(t) for t in ("premium=4", "standard=1")]
    classes = policy_classes.parse(__import__("yaml").safe_load(policy_classes.weights_yaml(weights)))
    assert [(c.name, c.weight) for c in classes.classes] == [("premium", 4), ("standard", 1)]
    assert classes.default == "standard"
    for bad in ("premium", "premium=0", "premium=1.5", "a b=2"):
        with pytest.raises(ValueError, match="--policy-class .* is not NAME=WEIGHT"):
            policy_classes.parse_weight(bad)


@pytest.mark.parametrize(("change", "message"), [
    ("models: {m: {}}\n", "models: per-model profiles are not built"),
    ("worker_selection: {aggregated: x}\n", "worker_selection: named worker-selection instances are not built"),
    ("  - {name: slow, policy_family: slow, cache_bucket: all, quantum: 1, prefill_busy_threshold_frac: 0.5}\n",
     "policy class 'slow': prefill_busy_threshold_frac is not built per class; use --router-queue-threshold"),
    ("  - {name: zero, quantum: 0}\n", "policy class 'zero': quantum must be an integer greater than zero"),
    ("  - {name: lcfs, quantum: 1, queue_policy: lcfs}\n", "queue_policy must be fcfs or wspt"),
    ("  - {name: premium, quantum: 1}\n", "duplicate policy class 'premium'"),
    ("  - {name: odd, policy_family: odd, quantum: 1}\n", "give both policy_family and cache_bucket, or neither"),
])
def test_what_is_not_built_is_refused_in_one_line_naming_the_key(tmp_path, change, message):
    path = tmp_path / "policy.yaml"
    path.write_text(YAML + change if change.startswith("  -") else change + YAML)
    with pytest.raises(ValueError, match=message) as e:
        router_config.parse_config(["--router-policy-config", str(path)], {})
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_cache_buckets_and_unreadable_files_are_refused(tmp_path):
    two = YAML.replace("  - {min_tokens: 0, bucket: all}\n",
                       "  - {min_tokens: 0, bucket: all}\n  - {min_tokens: 512, bucket: long}\n")
    with pytest.raises(PolicyConfigError, match="classes by uncached prompt length are not built"):
        policy_classes.parse(__import__("yaml").safe_load(two))
    with pytest.raises(PolicyConfigError, match="cannot read it"):
        policy_classes.load(str(tmp_path / "missing.yaml"))
    (tmp_path / "bad.yaml").write_text("policy_classes: [\n")
    with pytest.raises(PolicyConfigError, match="not YAML"):
        policy_classes.load(str(tmp_path / "bad.yaml"))


def test_meshfront_run_gives_every_router_the_classes_as_a_policy_config(tmp_path):
    from services.launcher import run

    args = run.parse_args(["--policy-class", "premium=4", "--policy-class", "standard=1"])
    run._write_policy_config(args, tmp_path)
    flag = args.router_flag[-1]
    assert flag.startswith("--router-policy-config=")
    classes = router_config.parse_config([flag], {}).policy_classes
    assert [(c.name, c.weight) for c in classes.classes] == [("premium", 4), ("standard", 1)]
    with pytest.raises(SystemExit) as e:
        run.parse_args(["--policy-class", "premium=4", "--policy-class", "premium=1"])
    assert e.value.code == 2

"""Which policy class and tenant a request asks the router for: its key's classes, the header among them, any
class without --auth, batch lines apart (services/gateway/scheduling.py)."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.router.v1 import router_pb2

from services.common.errors import InvalidRequest
from services.gateway import auth, scheduling
from services.gateway.auth.keys import KeyRecord
from services.gateway.scheduling import HEADER, Placement, PolicyClassNotAllowed, placement

pytestmark = pytest.mark.unit

GOLD_OR_SILVER = KeyRecord("key_1", "acme", policy_class="gold,silver")
PLAIN = KeyRecord("key_2", "initech")


def test_a_keys_first_class_is_its_own_and_the_header_picks_among_those_it_lists():
    assert GOLD_OR_SILVER.policy_classes == ("gold", "silver") and PLAIN.policy_classes == ()
    assert placement({}, GOLD_OR_SILVER) == Placement("gold", "acme")
    assert placement({HEADER: "silver"}, GOLD_OR_SILVER) == Placement("silver", "acme")
    assert placement({}, PLAIN) == Placement("", "initech")  # the router's default class


@pytest.mark.parametrize(("record", "asked", "allows"), [
    (GOLD_OR_SILVER, "platinum", "only gold, silver"),
    (PLAIN, "gold", "none (it runs in the default class)"),
])
def test_a_class_the_key_does_not_list_is_a_403_naming_what_it_allows(record, asked, allows):
    with pytest.raises(PolicyClassNotAllowed) as e:
        placement({HEADER: asked}, record)
    assert e.value.http_status == 403 and e.value.code == "policy_class_not_allowed" and e.value.param == HEADER
    assert allows in e.value.message


def test_without_auth_the_header_picks_any_class_and_a_bad_name_is_a_400():
    assert placement({HEADER: "premium"}, None) == Placement("premium", "")
    assert placement({}, None) == Placement()
    for bad in ("gold,silver", "no spaces", "x" * 65):
        with pytest.raises(InvalidRequest, match=f"The {HEADER} header .* is not a class name"):
            placement({HEADER: bad}, None)


def test_key_class_lists_are_checked_name_by_name():
    assert not KeyRecord("k", "t", policy_class="a,b.c,d-e").errors()
    assert "not a class name or a comma list" in KeyRecord("k", "t", policy_class="a,,b").errors()[0]


def test_the_placement_reaches_the_route_request_and_a_batch_line_keeps_its_own():
    async def request(headers: dict[str, str], batch_tenant: str = "") -> router_pb2.RouteRequest:
        if batch_tenant:
            auth.BATCH_LINE.set(True)
            scheduling.batch_line(batch_tenant)
        scheduling.place(GOLD_OR_SILVER, headers)  # the front door, at admission
        await asyncio.sleep(0)
        routed = await asyncio.ensure_future(_stamped())  # a task the request starts inherits it
        return routed

    async def _stamped() -> router_pb2.RouteRequest:
        return scheduling.stamp(router_pb2.RouteRequest(request_id="r", model="m"))

    async def main() -> list[router_pb2.RouteRequest]:
        # Each request in a task of its own, as the gRPC server runs them: placements do not leak across.
        return list(await asyncio.gather(asyncio.ensure_future(request({HEADER: "silver"})),
                                         asyncio.ensure_future(request({}, batch_tenant="acme"))))

    interactive, batch = asyncio.run(main())
    assert (interactive.policy_class, interactive.tenant, interactive.batch) == ("silver", "acme", False)
    assert (batch.policy_class, batch.tenant, batch.batch) == ("", "acme", True)
    assert scheduling.stamp(router_pb2.RouteRequest()).tenant == ""  # outside any request: unplaced

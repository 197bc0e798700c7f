"""``meshfront run``'s banner says what a newcomer needs next: a curl that works, and where other frontends join."""

from __future__ import annotations

from services.launcher.announce import banner


def test_the_banners_curl_carries_a_key_when_the_mesh_checks_them():
    open_mesh = banner("http://127.0.0.1:8000", "nats://127.0.0.1:4222")
    assert "try: curl http://127.0.0.1:8000/v1/models" in open_mesh
    assert "meshfront frontend --nats-url nats://127.0.0.1:4222" in open_mesh and "keys" not in open_mesh
    checked = banner("http://127.0.0.1:8000", auth=True)
    assert 'curl -H "Authorization: Bearer $KEY" http://127.0.0.1:8000/v1/models' in checked
    assert "meshfront keys create" in checked

"""The mTLS flags' rules and the name a replica-list target is verified against."""

from __future__ import annotations

import pytest

from services.common import tls

pytestmark = pytest.mark.unit


def test_off_without_a_certificate():
    assert tls.load("", "", "") is None


@pytest.mark.parametrize(("cert", "key", "ca"), [("c.pem", "", ""), ("", "k.pem", ""), ("", "", "ca.pem")])
def test_incomplete_flags_are_refused(cert, key, ca):
    with pytest.raises(ValueError, match="--tls-"):
        tls.load(cert, key, ca)


def test_loads_pem_bytes_and_is_mutual_with_a_ca(tmp_path):
    for name in ("c", "k", "ca"):
        (tmp_path / name).write_bytes(name.encode())
    files = tls.load(str(tmp_path / "c"), str(tmp_path / "k"), str(tmp_path / "ca"))
    assert (files.cert, files.key, files.ca, files.mutual) == (b"c", b"k", b"ca", True)
    assert not tls.load(str(tmp_path / "c"), str(tmp_path / "k")).mutual


@pytest.mark.parametrize(("target", "host"), [
    ("ipv4:10.0.0.1:9300,10.0.0.2:9300", "10.0.0.1"),
    ("ipv6:[::1]:9300,[::2]:9300", "::1"),
    ("ipv4:10.0.0.1:9300", ""),
    ("127.0.0.1:9300", ""),
    ("dns:///router:9300", ""),
])
def test_list_targets_are_verified_against_the_first_host(target, host):
    assert tls._list_target_host(target) == host

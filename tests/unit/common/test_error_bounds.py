"""Error messages and params echo client values; MeshError bounds both, whatever raised it."""

from __future__ import annotations

import pytest

from services.common.errors import (
    MAX_MESSAGE_BYTES,
    MAX_PARAM_BYTES,
    InvalidRequest,
    NotFound,
    bounded,
    from_status_proto,
    status_proto,
)

pytestmark = pytest.mark.unit


def test_a_100_kb_echo_is_cut_in_the_middle_keeping_both_ends():
    rid = "resp_" + "x" * 100_000
    err = NotFound(f"Previous response with id '{rid}' not found.", param="previous_response_id")
    assert len(err.message.encode()) <= MAX_MESSAGE_BYTES
    assert err.message.startswith("Previous response with id 'resp_xxx")
    assert err.message.endswith("' not found.")
    assert "bytes cut" in err.message
    # What travels between services (the status details) is the bounded message too.
    assert len(status_proto(err).SerializeToString()) < 2 * MAX_MESSAGE_BYTES
    assert from_status_proto(status_proto(err)).message == err.message


@pytest.mark.parametrize("char", ["a", "é", "語", "😀"])
def test_a_cut_never_splits_a_character_or_passes_the_limit(char):
    for n in (MAX_MESSAGE_BYTES - 1, MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 1, 5000):
        text = char * n
        out = bounded(text, MAX_MESSAGE_BYTES)
        assert len(out.encode()) <= MAX_MESSAGE_BYTES
        assert out == text if len(text.encode()) <= MAX_MESSAGE_BYTES else out != text
        out.encode().decode()  # whole characters only


def test_a_client_chosen_param_is_bounded_and_short_ones_are_untouched():
    assert len(InvalidRequest("unknown parameter", param="p" * 100_000).param.encode()) <= MAX_PARAM_BYTES
    err = InvalidRequest("'messages' must not be empty", param="messages")
    assert (err.message, err.param) == ("'messages' must not be empty", "messages")
    assert InvalidRequest("x").param is None

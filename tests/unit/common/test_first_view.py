"""Every stage listens only once it has a first view of the workers (services/common/service_main.py).

A router SIGKILLed under arriving requests through ``meshfront run`` answered three of them "model does not
exist" (404) after its restart: it listened before its discovery mirror had read the bucket. The gateway
alone waited for that view; every stage that answers from the view must.
"""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.unit

STAGES = ("gateway", "router", "preprocessor", "postprocessor", "allinone")


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_waits_for_its_first_view_before_listening(stage):
    spec = importlib.import_module(f"services.{stage}.main").SPEC
    assert spec.first_view_wait_s > 0

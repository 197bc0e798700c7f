"""The model files' manifest: one digest per set of files, checked on the way back, names never paths."""

from __future__ import annotations

import json

import pytest

from services.common import model_files as mf

pytestmark = pytest.mark.unit


def test_the_digest_is_of_the_stage_files_only_and_stable(tmp_path, demo_model_dir):
    digest = mf.model_files_digest(demo_model_dir)
    assert len(digest) == 64 and mf.model_files_digest(demo_model_dir) == digest
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, data in mf.read_stage_files(demo_model_dir).items():
        (copy / name).write_bytes(data)
    (copy / "model.safetensors").write_bytes(b"weights are not published")
    assert mf.model_files_digest(copy) == digest  # same files, other place, weights beside: same digest
    (copy / "tokenizer_config.json").write_bytes(b"{}")
    assert mf.model_files_digest(copy) != digest


def test_a_directory_without_a_tokenizer_has_no_digest(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert mf.model_files_digest(tmp_path) == ""


def test_a_manifest_is_checked_against_the_digest_it_was_fetched_by(demo_model_dir):
    raw = mf.manifest_bytes(mf.read_stage_files(demo_model_dir))
    digest = mf.model_files_digest(demo_model_dir)
    assert "tokenizer.json" in mf.parse_manifest(raw, digest)
    with pytest.raises(mf.ModelFilesUnavailable, match="does not have that digest"):
        mf.parse_manifest(raw + b" ", digest)


def test_a_manifest_naming_a_path_is_refused():
    raw = json.dumps({"version": 1, "files": {"../../etc/cron.d/x": {"sha256": "0" * 64, "size": 1}}}).encode()
    with pytest.raises(mf.ModelFilesUnavailable, match="not a model file"):
        mf.parse_manifest(raw, mf._sha256(raw))


def test_files_land_whole_or_not_at_all(tmp_path):
    target = mf.write_whole(tmp_path, "d" * 64, {"tokenizer.json": b"{}", "config.json": b"{}"})
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "tokenizer.json"]
    assert mf.write_whole(tmp_path, "d" * 64, {"tokenizer.json": b"other"}) == target  # already there: kept
    assert (target / "tokenizer.json").read_bytes() == b"{}"
    assert [p.name for p in tmp_path.iterdir()] == ["d" * 64]  # no temporary directory left behind

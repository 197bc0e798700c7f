"""Generate Python stubs and Envoy's descriptor set from protos/.

Usage: python tools/codegen.py [--check]

Outputs (committed, never edited by hand):
  gen/python/meshfront/**      *_pb2.py, *_pb2.pyi, *_pb2_grpc.py
  deploy/envoy/gateway.pb      FileDescriptorSet for grpc_json_transcoder (every protos/meshfront/gateway/v1/*.proto)
  gen/python/meshfront/kserve/inference.binpb
                               FileDescriptorSet of protos/inference (KServe v2). No
                               *_pb2.py for it: those would register `inference.*` in
                               protobuf's default pool and clash with tritonclient's
                               own modules in any process that imports both, so the
                               gateway loads this set into a private pool instead.

--check regenerates into a temporary folder and exits 1 if anything differs,
so CI fails when stubs drift from the protos.
"""

from __future__ import annotations

import filecmp
import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
THIRD_PARTY = ROOT / "third_party"
WKT = pathlib.Path(protoc.__file__).parent / "_proto"
GATEWAY_PROTOS = "meshfront/gateway/v1"  # every HTTP-facing service Envoy transcodes lives here
KSERVE_PROTOS = ("inference/model_config.proto", "inference/grpc_service.proto")


def _proto_files() -> list[str]:
    return sorted(str(p.relative_to(PROTOS)) for p in PROTOS.glob("meshfront/**/*.proto"))


def _run(args: list[str]) -> None:
    code = protoc.main(["protoc", f"-I{PROTOS}", f"-I{THIRD_PARTY}", f"-I{WKT}", *args])
    if code != 0:
        raise SystemExit(f"protoc failed ({code}): {' '.join(args)}")


def generate(out: pathlib.Path) -> None:
    py_out = out / "gen" / "python"
    py_out.mkdir(parents=True, exist_ok=True)
    _run([f"--python_out={py_out}", f"--pyi_out={py_out}", f"--grpc_python_out={py_out}", *_proto_files()])
    for pkg in py_out.glob("meshfront/**/"):
        (pkg / "__init__.py").touch()
    (py_out / "meshfront" / "__init__.py").touch()
    kserve = py_out / "meshfront" / "kserve"
    kserve.mkdir(parents=True, exist_ok=True)
    (kserve / "__init__.py").touch()
    _run([f"--descriptor_set_out={kserve / 'inference.binpb'}", *KSERVE_PROTOS])
    desc = out / "deploy" / "envoy" / "gateway.pb"
    desc.parent.mkdir(parents=True, exist_ok=True)
    # error_details lets convert_grpc_status render google.rpc.Status details.
    gateway = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / GATEWAY_PROTOS).glob("*.proto"))
    _run(["--include_imports", f"--descriptor_set_out={desc}", *gateway, "google/rpc/error_details.proto"])


def _diff(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    out = [f"only in one tree: {p}" for p in sorted(files_a ^ files_b)]
    out += [f"differs: {p}" for p in sorted(files_a & files_b) if not filecmp.cmp(a / p, b / p, shallow=False)]
    return out


def main() -> int:
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            generate(pathlib.Path(tmp))
            problems = _diff(ROOT / "gen" / "python", pathlib.Path(tmp) / "gen" / "python")
            fresh = pathlib.Path(tmp) / "deploy/envoy/gateway.pb"
            if not filecmp.cmp(ROOT / "deploy/envoy/gateway.pb", fresh, shallow=False):
                problems.append("differs: deploy/envoy/gateway.pb")
        for line in problems:
            print(line)
        if problems:
            print("generated code is stale: run `make gen`")
        return 1 if problems else 0
    shutil.rmtree(ROOT / "gen" / "python" / "meshfront", ignore_errors=True)
    generate(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())

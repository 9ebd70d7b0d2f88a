"""Standard protobuf classes for `protos/`, built by grpcio-tools' protoc: an independent codec.

The protos are compiled to a descriptor set and loaded into a private DescriptorPool, so no generated
`grpc/` or `google/` Python package can shadow grpcio or googleapis on import.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from tests.support import REPO

PROTOS = REPO / "protos"


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    """Every proto under protos/, compiled once per test process."""
    files = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        argv = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{_grpc_tools_include()}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            *files,
        ]
        subprocess.run(argv, check=True, capture_output=True, text=True)
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    result = descriptor_pool.DescriptorPool()
    for file_proto in fds.file:
        result.Add(file_proto)
    return result


def message_class(full_name: str) -> type[Message]:
    """The standard protobuf class of a message, e.g. `grpc.health.v1.HealthCheckRequest`."""
    return message_factory.GetMessageClass(pool().FindMessageTypeByName(full_name))


def _grpc_tools_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")

"""Meshfront's services.

gRPC core logs at absl's default level (INFO) when ``GRPC_VERBOSITY`` is unset, and reads it once, when grpc is
imported: every idle connection a server closes (``grpc.max_connection_idle_ms``, services/common/grpc_server.py)
would print a "Got goaway ... UNAVAILABLE" line in its client's log. Every service and worker imports this
package before grpc, so gRPC's documented default (ERROR) holds unless the environment says otherwise.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

"""A Hugging Face-compatible file server on a loopback port, for tests of models named by hub id.

It answers what ``huggingface_hub.snapshot_download`` asks (huggingface_hub 2.4): a revision's info, the
repository tree at that commit, and each file by ``resolve`` (HEAD with the commit and ETag, then GET). One
repository, its files read from a directory; revisions map to fake commit ids. ``requests`` lists what was
asked, so a test sees whether the cache or the server answered."""

from __future__ import annotations

import hashlib
import http.server
import json
import pathlib
import threading
import urllib.parse


class HubServer:
    def __init__(self, repo: str, files_dir: pathlib.Path, revisions: dict[str, str]):
        """``revisions``: name (branch/tag) -> 40-hex commit; the commit itself is a revision too."""
        self.repo = repo
        self.files = {p.name: p.read_bytes() for p in files_dir.iterdir() if p.is_file()}
        self.revisions = {**revisions, **{c: c for c in revisions.values()}}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                server._answer(self, head=True)

            def do_GET(self) -> None:
                server._answer(self, head=False)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _answer(self, h: http.server.BaseHTTPRequestHandler, *, head: bool) -> None:
        path = urllib.parse.urlsplit(h.path).path
        self.requests.append(f"{h.command} {path}")
        api = f"/api/models/{self.repo}/"
        if path.startswith(api + "revision/"):
            commit = self.revisions.get(urllib.parse.unquote(path[len(api + "revision/"):]))
            if commit is None:
                return self._send(h, 404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
            body = {"id": self.repo, "sha": commit, "siblings": [{"rfilename": n} for n in self.files]}
            return self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})
        if path.startswith(api + "tree/"):
            tree = [{"type": "file", "path": n, "size": len(d), "oid": _git_oid(d)} for n, d in self.files.items()]
            return self._send(h, 200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
        prefix = f"/{self.repo}/resolve/"
        if path.startswith(prefix):
            revision, _, name = path[len(prefix):].partition("/")
            commit, data = self.revisions.get(revision), self.files.get(name)
            if commit is not None and data is not None:
                headers = {"X-Repo-Commit": commit, "ETag": f'"{_git_oid(data)}"'}
                return self._send(h, 200, b"" if head else data, headers, length=len(data))
            return self._send(h, 404, b"", {"X-Error-Code": "EntryNotFound"})
        if path.startswith("/api/models/"):  # another repository: the hub answers 401 for unknown and private
            return self._send(h, 401, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        self._send(h, 404, b"", {})

    @staticmethod
    def _send(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str], *,
              length: int | None = None) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        h.end_headers()
        if body:
            h.wfile.write(body)


def _git_oid(data: bytes) -> str:
    """A file's id as the hub gives it for small files (an opaque tag to the client)."""
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()

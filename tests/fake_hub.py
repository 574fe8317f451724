"""A local stand-in for huggingface.co that real huggingface-hub talks to: the repo tree listing and file downloads.

Each file is served with the LFS sha256 the listing claims; a test can make the claim wrong to play a corrupted
download. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

COMMIT = "c" * 40


@dataclass
class HubFileSpec:
    data: bytes
    claimed_sha256: str | None = None  # what the listing and the ETag say; None: the true sha256

    @property
    def sha256(self) -> str:
        return self.claimed_sha256 or hashlib.sha256(self.data).hexdigest()


@dataclass
class FakeHub:
    url: str
    repos: dict[str, dict[str, HubFileSpec]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)  # "METHOD path" of every request served

    def downloads(self) -> list[str]:
        return [r.split(" ", 1)[1] for r in self.requests if r.startswith("GET ") and "/resolve/" in r]


def _handler(hub: FakeHub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _route(self, method: str) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(f"{method} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                self._tree("/".join(parts[2:4]))
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._file("/".join(parts[:2]), "/".join(parts[4:]), send_body=method == "GET")
            else:
                self._missing("RepoNotFound")

        def _tree(self, repo: str) -> None:
            files = hub.repos.get(repo)
            if files is None:
                self._missing("RepoNotFound")
                return
            listing = [
                {
                    "type": "file",
                    "oid": hashlib.sha1(path.encode()).hexdigest(),
                    "size": len(spec.data),
                    "path": path,
                    "lfs": {"oid": spec.sha256, "size": len(spec.data), "pointerSize": 134},
                }
                for path, spec in sorted(files.items())
            ]
            body = json.dumps(listing).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, repo: str, path: str, send_body: bool) -> None:
            spec = hub.repos.get(repo, {}).get(path)
            if spec is None:
                self._missing("RepoNotFound" if repo not in hub.repos else "EntryNotFound")
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{spec.sha256}"')
            self.send_header("Content-Length", str(len(spec.data)))
            self.end_headers()
            if send_body:
                self.wfile.write(spec.data)

        def _missing(self, code: str) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            self._route("HEAD")

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def serve_hub() -> Iterator[FakeHub]:
    hub = FakeHub(url="")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

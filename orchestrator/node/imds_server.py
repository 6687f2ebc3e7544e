"""A node's instance metadata endpoint, answering like EC2's IMDSv2 (the part orch reads).

Local nodes and sandbox hosts run one of these so the spot watcher on the node polls the same
URLs it polls on AWS:

    PUT /latest/api/token                       (header X-aws-ec2-metadata-token-ttl-seconds)
        -> a session token
    GET /latest/meta-data/instance-id           -> the node's instance id
    GET /latest/meta-data/spot/instance-action  -> {"action": "terminate", "time": "<UTC>"}
                                                   or 404 while there is no notice
    GET /latest/meta-data/iam/security-credentials/        -> the role name (with --role)
    GET /latest/meta-data/iam/security-credentials/<role>  -> its temporary credentials, as
                                                   boto3 reads them (keys a sandbox's moto
                                                   accepts; no real AWS key is ever served)
    (every GET needs the header X-aws-ec2-metadata-token with a live token, else 401)

The notice is whatever JSON document lies in the `--notice-file` when asked (written atomically
by whoever reclaims the node); no file means no notice. Stdlib only: this runs inside a node's
network namespace with nothing but Python.

    python -m orchestrator.node.imds_server --bind 169.254.169.254 --port 80 \
        --instance-id l-1234 --notice-file /path/to/notice.json [--role orch-node]
"""

from __future__ import annotations

import argparse
import json
import secrets
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

if __package__:
    from orchestrator.node.node_kit import write_file
else:  # in the node runtime: its modules are beside it
    from node_kit import write_file

TOKEN_PATH = "/latest/api/token"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
CREDENTIALS_PATH = "/latest/meta-data/iam/security-credentials/"
CREDENTIALS_TTL_S = 6 * 3600
MAX_TTL_S = 21600  # EC2's upper bound for a token's lifetime


class MetadataState:
    """Tokens issued so far and where the notice is read from. Thread-safe."""

    def __init__(self, instance_id: str, notice_file: Path, role: str | None = None) -> None:
        self.instance_id = instance_id
        self.notice_file = notice_file
        self.role = role
        self._tokens: dict[str, float] = {}
        self._lock = threading.Lock()

    def issue(self, ttl_s: int) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            self._tokens = {t: exp for t, exp in self._tokens.items() if exp > now}
            self._tokens[token] = now + ttl_s
        return token

    def valid(self, token: str | None) -> bool:
        if not token:
            return False
        with self._lock:
            expiry = self._tokens.get(token)
        return expiry is not None and expiry > time.monotonic()

    def credentials(self) -> bytes:
        """The role's temporary credentials document (EC2's shape), valid for six hours."""
        now = time.time()
        stamp = "%Y-%m-%dT%H:%M:%SZ"
        document = {
            "Code": "Success",
            "LastUpdated": time.strftime(stamp, time.gmtime(now)),
            "Type": "AWS-HMAC",
            "AccessKeyId": "ASIASANDBOX" + self.instance_id[-8:].upper(),
            "SecretAccessKey": "sandbox-secret-" + self.instance_id,
            "Token": "sandbox-token-" + secrets.token_hex(8),
            "Expiration": time.strftime(stamp, time.gmtime(now + CREDENTIALS_TTL_S)),
        }
        return json.dumps(document).encode()

    def notice(self) -> bytes | None:
        """The notice document as served, or None when there is none (or it is unreadable)."""
        try:
            document = json.loads(self.notice_file.read_text())
        except (OSError, ValueError):
            return None
        return json.dumps(document).encode()


def make_handler(state: MetadataState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "EC2ws"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # a node polls every few seconds; its log would only fill the disk

        def _reply(self, code: int, body: bytes = b"", kind: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
            if self.path != TOKEN_PATH:
                self._reply(404)
                return
            try:
                ttl = int(self.headers.get(TTL_HEADER, ""))
            except ValueError:
                ttl = 0
            if not 1 <= ttl <= MAX_TTL_S:
                self._reply(400, b"missing or invalid " + TTL_HEADER.encode())
                return
            self._reply(200, state.issue(ttl).encode())

        def do_GET(self) -> None:  # noqa: N802
            if not state.valid(self.headers.get(TOKEN_HEADER)):
                self._reply(401)
                return
            if self.path == INSTANCE_ID_PATH:
                self._reply(200, state.instance_id.encode())
            elif self.path == INSTANCE_ACTION_PATH:
                notice = state.notice()
                if notice is None:
                    self._reply(404)
                else:
                    self._reply(200, notice, "application/json")
            elif state.role and self.path in (CREDENTIALS_PATH, CREDENTIALS_PATH.rstrip("/")):
                self._reply(200, state.role.encode())
            elif state.role and self.path == CREDENTIALS_PATH + state.role:
                self._reply(200, state.credentials(), "application/json")
            else:
                self._reply(404)

    return Handler


class _Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer would look its own address up in DNS (getfqdn); a node must not send
        # DNS queries anywhere just to serve metadata.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


def serve(bind: str, port: int, state: MetadataState) -> ThreadingHTTPServer:
    """Bind the endpoint (port 0: any free one) and return the server, not yet serving."""
    server = _Server((bind, port), make_handler(state))
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    # not the module's docstring: the runtime ships its modules without docstrings
    parser = argparse.ArgumentParser(
        prog="imds_server", description="A node's instance metadata endpoint (EC2's IMDSv2)."
    )
    parser.add_argument("--bind", default="169.254.169.254")
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--notice-file", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, help="written with the bound port once serving")
    parser.add_argument("--role", help="the instance profile's role: serve its credentials")
    args = parser.parse_args(argv)
    state = MetadataState(args.instance_id, args.notice_file, args.role)
    server = serve(args.bind, args.port, state)
    if args.ready_file:
        write_file(str(args.ready_file), str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()

"""The spot-notice watch: an event of the node's daemon (`events`, run by the guard).

Part of the node runtime: standard library only, Python 3.8 or newer. Every `interval_s` it
polls the instance metadata endpoint the guard's terms name (`metadata_url`) the way EC2
documents for IMDSv2: a session token from `PUT /latest/api/token`, then
`GET /latest/meta-data/spot/instance-action` (404 = no notice). Proxies are bypassed: the
endpoint is link-local (or loopback on local nodes). What it learns it appends, one line
each, to the node's notice file, `orch-jobs/.node/spot-notices` under the login user's home
(the controller follows it over SSH; `orchestrator.node.spot_notice` reads the lines):

    ready                       the endpoint answered (once)
    notice {"action": ..., "time": ...}   a notice was posted (once; polling goes on)
    unavailable <why>           no endpoint answered UNAVAILABLE_AFTER times in a row before
                                any did (or the terms name none); the watch ends

The file is the guard's, given to the login user and written without following a symlink:
each line is appended to it while it is a regular file of its own (`guard_files.append_at`);
anything else found there is replaced by every line this watch has said. A started guard says
`ready` again, so the file holds a few lines per boot of the guard, at most NOTICE_LIMIT bytes.
"""

import contextlib
import json
import os
import time
import urllib.error
import urllib.request

if __package__:
    from orchestrator.node.events import Event
    from orchestrator.node.guard_files import append_at, open_dir
else:  # the program on a node: its modules are beside it
    from events import Event
    from guard_files import append_at, open_dir

FOLDER = ("orch-jobs", ".node")  # home-relative, where the node runtime lies too
NOTICE_FILE = "spot-notices"
NOTICE_LIMIT = 64 * 1024  # bytes the notice file may hold
UNAVAILABLE_AFTER = 3  # failed polls before any success that mean "no metadata service"
TOKEN_TTL_S = 300  # a token is asked for again this often (it is granted for 600 s)
BODY_LIMIT = 4096  # bytes of an answer read at most (EC2's notice takes about 60)


class NoticeWatch(Event):
    """Polls the metadata endpoint at `url` (None: the terms name none) every `interval_s`
    and appends what it learns to the notice file under `home`, given to `owner` (uid, gid;
    None: left as made). What the endpoint does is the protocol's (`unavailable`); a notice
    file that cannot be written raises, and its lines are written at the next run."""

    name = "notices"
    first_s = 0.0  # at once: the controller waits for `ready`

    def __init__(self, home, owner, url, interval_s):
        self.home = home
        self.owner = owner
        self.url = url.rstrip("/") if url else None
        self.period_s = interval_s
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.token = None
        self.token_at = 0.0
        self.failures_in_a_row = 0
        self.said = []  # every line this watch has said
        self.written = 0  # how many of them are in the file

    def run(self, now):
        if self.url is None and not self.said:
            self.said.append("unavailable the guard's terms name no metadata endpoint")
        elif self.url is not None:
            self.poll()
        if self.written < len(self.said):
            self.flush()
        self.finished = bool(self.said) and self.said[-1].startswith("unavailable")

    def fetch(self, path, method="GET", headers=None):
        req = urllib.request.Request(self.url + path, method=method, headers=headers or {})
        return self.opener.open(req, timeout=2).read(BODY_LIMIT).decode()

    def poll(self):
        """One look at the spot instance-action, as IMDSv2 asks (a session token first)."""
        try:
            if self.token is None or time.monotonic() - self.token_at > TOKEN_TTL_S:
                ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "600"}
                self.token = self.fetch("/latest/api/token", "PUT", ttl)
                self.token_at = time.monotonic()
            try:
                action = "/latest/meta-data/spot/instance-action"
                body = self.fetch(action, headers={"X-aws-ec2-metadata-token": self.token})
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    self.token = None
                elif exc.code != 404:
                    raise
                body = None
        except Exception as exc:  # whatever the endpoint does, it is no endpoint
            self.failures_in_a_row += 1
            if "ready" not in self.said and self.failures_in_a_row >= UNAVAILABLE_AFTER:
                self.said.append("unavailable " + repr(exc)[:200])
            return
        self.failures_in_a_row = 0
        if "ready" not in self.said:
            self.said.append("ready")
        if body is not None and len(self.said) == 1:  # `ready` only: no notice said yet
            with contextlib.suppress(ValueError, RecursionError):  # not JSON: asked again
                self.said.append("notice " + json.dumps(json.loads(body)))

    def flush(self):
        """Append the lines not in the file yet (all of them where the file is not one the
        guard may append to)."""
        fd = open_dir(self.home, FOLDER, make=(0o755, self.owner))
        try:
            new = "".join(line + "\n" for line in self.said[self.written :])
            whole = "".join(line + "\n" for line in self.said)
            append_at(fd, NOTICE_FILE, new, whole, owner=self.owner, limit=NOTICE_LIMIT)
        finally:
            os.close(fd)
        self.written = len(self.said)

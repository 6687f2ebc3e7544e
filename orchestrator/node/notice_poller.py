"""The spot-notice poller that runs on a node (see `orchestrator.node.spot_notice`).

Part of the node runtime: standard library only, Python 3.8 or newer.

    notice_poller.py METADATA_URL INTERVAL_S

Polls the instance metadata endpoint the way EC2 documents for IMDSv2 (a session token from
`PUT /latest/api/token`, then `GET /latest/meta-data/spot/instance-action`; 404 = no notice)
every INTERVAL_S seconds and prints `ready` (once), `notice <document>` (once; polling goes
on) or `unavailable <why>` (then exits). Proxies are bypassed.
"""

import json
import sys
import time
import urllib.error
import urllib.request

UNAVAILABLE_AFTER = 3  # failed polls before any success that mean "no metadata service"
TOKEN_TTL_S = 300  # a token is asked for again this often (it is granted for 600 s)


def poll(base, interval):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    token, token_at, ready, noticed, failures = None, 0.0, False, False, 0
    while True:
        try:
            if token is None or time.monotonic() - token_at > TOKEN_TTL_S:
                req = urllib.request.Request(
                    base + "/latest/api/token",
                    method="PUT",
                    headers={"X-aws-ec2-metadata-token-ttl-seconds": "600"},
                )
                token, token_at = opener.open(req, timeout=2).read().decode(), time.monotonic()
            req = urllib.request.Request(
                base + "/latest/meta-data/spot/instance-action",
                headers={"X-aws-ec2-metadata-token": token},
            )
            try:
                body = opener.open(req, timeout=2).read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    token = None
                elif exc.code != 404:
                    raise
                body = None
            failures = 0
            if not ready:
                ready = True
                print("ready", flush=True)
            if body is not None and not noticed:
                noticed = True
                print("notice " + json.dumps(json.loads(body)), flush=True)
        except Exception as exc:
            failures += 1
            if not ready and failures >= UNAVAILABLE_AFTER:
                print("unavailable " + repr(exc)[:200], flush=True)
                return 0
        time.sleep(interval)


def main(argv):
    if len(argv) != 2:
        print("usage: notice_poller.py METADATA_URL INTERVAL_S", file=sys.stderr)
        return 2
    return poll(argv[0].rstrip("/"), float(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

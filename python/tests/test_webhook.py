"""The webhook source over real HTTP on loopback: statuses and messages,
signatures, flush policy, and kill -9 while clients post."""
import gzip
import hashlib
import hmac
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import http.client

import pytest

import ubik

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UBIK = os.environ.get("UBIK_BIN", os.path.join(REPO, "target", "debug", "ubik"))
SCHEMA = "id BIGINT, kind VARCHAR, ts TIMESTAMP"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body, headers=None, path="/hooks"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, (json.loads(data) if data.startswith(b"{") else data.decode()), dict(r.getheaders())


def wait_up(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"endpoint on {port} did not come up")


def event(i, kind="charge"):
    return {"id": i, "kind": kind, "ts": "2024-01-01T00:00:%02dZ" % (i % 60)}


@pytest.fixture
def endpoint(tmp_path):
    """A pipeline serving a webhook endpoint (not iterated: the buffer only fills)."""
    made = []

    def make(options="", auth_env=None):
        port = free_port()
        n = len(made)
        url = f"webhook://127.0.0.1:{port}/hooks?buffer={tmp_path / ('buf%d' % n)}{options}"
        s = ubik.pipeline("SELECT * FROM hooks", from_=url, schema=SCHEMA, checkpoint=str(tmp_path / f"ck{n}"))
        made.append(s)
        wait_up(port)
        return port, s

    yield make
    for s in made:
        s.close()


def test_statuses_and_messages(endpoint):
    port, _ = endpoint("&max_body=2KiB&max_buffer_bytes=4KiB")
    ok = post(port, json.dumps(event(1)))
    assert ok[0] == 200 and ok[1]["accepted"] == 1
    assert post(port, json.dumps([event(2), event(3)]))[1]["accepted"] == 2
    assert post(port, "\n".join(json.dumps(event(i)) for i in range(4, 7)), {"Content-Type": "application/x-ndjson"})[1]["accepted"] == 3
    gz = gzip.compress(json.dumps(event(7)).encode())
    assert post(port, gz, {"Content-Encoding": "gzip"})[0] == 200

    status, body, _ = post(port, '{"id": 1,\n "kind": }')
    assert status == 400 and "line 2" in body["error"] and body["reason"] == "malformed_json"
    status, body, _ = post(port, "[1, 2]")
    assert status == 400 and "not a JSON object" in body["error"]
    status, body, _ = post(port, "x", {"Content-Type": "text/csv"})
    assert status == 415 and "application/json" in body["error"]
    status, body, _ = post(port, json.dumps({"pad": "x" * 5000}))
    assert status == 413 and "limit" in body["error"]
    bomb = gzip.compress(json.dumps({"pad": "y" * 100_000}).encode())
    assert post(port, bomb, {"Content-Encoding": "gzip"})[0] == 413
    # Nobody reads: the buffer fills up and the endpoint pushes back.
    statuses = [post(port, json.dumps({"id": i, "pad": "z" * 900}))[0] for i in range(10)]
    assert 429 in statuses
    status, body, headers = post(port, json.dumps(event(99)))
    assert status == 429 and headers.get("retry-after") == "1" and "full" in body["error"]


def test_signatures(endpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("HOOK_SECRET", "It's a Secret to Everybody")
    port, _ = endpoint("&auth=github&secret=env:HOOK_SECRET")
    body = json.dumps(event(1)).encode()
    sig = "sha256=" + hmac.new(b"It's a Secret to Everybody", body, hashlib.sha256).hexdigest()
    assert post(port, body, {"X-Hub-Signature-256": sig})[0] == 200
    status, reply, _ = post(port, body + b" ", {"X-Hub-Signature-256": sig})
    assert status == 401 and "does not match" in reply["error"]
    assert post(port, body)[0] == 401

    secret_file = tmp_path / "stripe.secret"
    secret_file.write_text("whsec_test\n")
    port, _ = endpoint(f"&auth=stripe&secret=file:{secret_file}&tolerance=300s")
    t = int(time.time())
    sig = hmac.new(b"whsec_test", f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert post(port, body, {"Stripe-Signature": f"t={t},v1={sig}"})[0] == 200
    old = t - 3600
    sig_old = hmac.new(b"whsec_test", f"{old}.".encode() + body, hashlib.sha256).hexdigest()
    status, reply, _ = post(port, body, {"Stripe-Signature": f"t={old},v1={sig_old}"})
    assert status == 401 and "stale" in reply["error"]

    monkeypatch.setenv("HOOK_TOKEN", "tok")
    port, _ = endpoint("&auth=bearer&secret=env:HOOK_TOKEN")
    assert post(port, body, {"Authorization": "Bearer tok"})[0] == 200
    assert post(port, body, {"Authorization": "Bearer no"})[0] == 401
    with pytest.raises(ubik.SourceError, match="never given on the command line"):
        ubik.stream("SELECT * FROM hooks", from_=f"webhook://127.0.0.1:{free_port()}/hooks?auth=bearer&secret=tok", schema=SCHEMA)


def test_dedupe_on_event_id(endpoint):
    port, s = endpoint("&dedupe=id&max_rows=3&buffer=memory")
    assert post(port, json.dumps([event(1), event(2)]))[1] == {"accepted": 2, "duplicates": 0}
    assert post(port, json.dumps([event(2), event(3)]))[1] == {"accepted": 1, "duplicates": 1}
    batch = next(iter(s))
    assert sorted(batch.column("id").to_pylist()) == [1, 2, 3]


def _flush_sizes(port, s, n, body_of):
    for i in range(n):
        assert post(port, body_of(i))[0] == 200
    sizes, total = [], 0
    it = iter(s)
    while total < n:
        b = next(it)
        sizes.append(b.num_rows)
        total += b.num_rows
    return sizes


def test_flush_by_rows_bytes_and_interval(endpoint):
    port, s = endpoint("&max_rows=50&max_bytes=1GiB&max_interval=1h")
    assert _flush_sizes(port, s, 200, lambda i: json.dumps(event(i))) == [50, 50, 50, 50]

    # max_bytes counts event bytes as received: ten 100-byte events per flush.
    bare = json.dumps({"id": 1, "kind": "", "ts": "2024-01-01T00:00:00Z"})
    one = json.dumps({"id": 1, "kind": "k" * (100 - len(bare)), "ts": "2024-01-01T00:00:00Z"})
    assert len(one) == 100
    port, s = endpoint("&max_rows=100000&max_bytes=1000&max_interval=1h")
    assert _flush_sizes(port, s, 40, lambda i: one) == [10, 10, 10, 10]

    port, s = endpoint("&max_rows=100000&max_bytes=1GiB&max_interval=300ms")
    for i in range(7):
        post(port, json.dumps(event(i)))
    t0 = time.time()
    b = next(iter(s))
    assert b.num_rows == 7 and time.time() - t0 < 2.0


def test_kill_9_while_clients_post_loses_no_acknowledged_event(tmp_path):
    port = free_port()
    ck, buf = tmp_path / "ck", tmp_path / "buf"
    url = f"webhook://127.0.0.1:{port}/hooks?buffer={buf}&max_rows=20&max_interval=50ms"
    cmd = [UBIK, "run", "SELECT id, kind FROM hooks", "--from", url, "--schema", SCHEMA,
           "--checkpoint", str(ck), "--checkpoint-interval", "100ms", "-q"]
    acked, lock, stop = set(), threading.Lock(), threading.Event()
    counter = iter(range(1_000_000))

    def client():
        while not stop.is_set():
            with lock:
                i = next(counter)
            try:
                status, _, _ = post(port, json.dumps(event(i)))
                if status == 200:
                    with lock:
                        acked.add(i)
            except OSError:
                time.sleep(0.01)

    outputs = []
    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    rnd = random.Random(3)
    try:
        for round_ in range(6):
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            wait_up(port)
            time.sleep(0.3 + rnd.random())
            if round_ < 5:
                proc.send_signal(signal.SIGKILL)
            else:
                stop.set()
                for t in threads:
                    t.join()
                time.sleep(0.5)
                proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
            if round_ == 5:
                assert proc.returncode == 0, err.decode()[-2000:]
            outputs.append(out.decode())
    finally:
        stop.set()
        for t in threads:
            t.join()
    lines = [l for o in outputs for l in o.split("\n") if l.endswith("}")]
    seen = {}
    for l in lines:
        v = json.loads(l)["value"]
        seen.setdefault(v["id"], set()).add(l)
    assert len(acked) > 100, f"only {len(acked)} events were acknowledged"
    missing = acked - seen.keys()
    assert not missing, f"{len(missing)} acknowledged events lost, e.g. {sorted(missing)[:5]}"
    assert all(len(v) == 1 for v in seen.values()), "an event was emitted twice with different bytes"


def test_stream_is_one_shot_over_what_the_buffer_holds(tmp_path):
    """stream() on a webhook URL serves nothing: it reads the events a
    pipeline accepted into its buffer and did not process, then ends."""
    port = free_port()
    url = f"webhook://127.0.0.1:{port}/hooks?buffer={tmp_path / 'buf'}"
    q = "SELECT kind, count(*) AS n FROM hooks GROUP BY kind"
    with ubik.pipeline(q, from_=url, schema=SCHEMA, checkpoint=str(tmp_path / "ck")):
        wait_up(port)
        body = "\n".join(json.dumps(event(i, "charge" if i % 3 else "refund")) for i in range(30))
        assert post(port, body, {"Content-Type": "application/x-ndjson"})[0] == 200
    # The same query's pipeline identity owns the buffer; a one-shot run of
    # it reads the 30 acknowledged events and returns, binding no port.
    got = ubik.stream(q, from_=url, schema=SCHEMA).arrow().to_pylist()
    assert sorted((r["kind"], r["n"]) for r in got) == [("charge", 20), ("refund", 10)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: the one-shot run served nothing

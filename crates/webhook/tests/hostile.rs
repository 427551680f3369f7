//! Hostile requests over real HTTP on loopback: each gets its documented
//! status, the endpoint keeps serving, good events sent between them all
//! reach the source (as typed rows), and nothing of a refused request is
//! stored.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef, TimeUnit};
use ubik_connector::{Payload, Source, SourceEvent};
use ubik_webhook::{BufferOwner, WebhookSource};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
        Field::new("amount", DataType::Float64, true),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
    ]))
}

fn open(options: &str, dir: &std::path::Path) -> WebhookSource {
    let url = format!("webhook://127.0.0.1:0/hooks?max_interval=10ms{options}");
    let owner = BufferOwner {
        default_dir: dir.join("buf"),
        identity: "test".into(),
    };
    WebhookSource::open(&url, &owner, Some(schema())).unwrap()
}

/// Sends raw bytes as one HTTP exchange; (status, body). Status 0: the
/// server closed the connection without a response.
fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

fn post_with(addr: SocketAddr, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut req = format!(
        "POST /hooks HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (k, v) in headers {
        req.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    exchange(addr, &req)
}

fn post(addr: SocketAddr, body: &[u8]) -> (u16, String) {
    post_with(addr, &[("Content-Type", "application/json")], body)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn good(i: usize) -> String {
    format!(r#"{{"id":"good-{i}","n":{i},"amount":1.5,"ts":"2026-11-29T15:01:00Z"}}"#)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// Every row the source hands out within `wait`, as (id, n, amount).
fn drain(source: &mut WebhookSource, wait: Duration) -> Vec<(String, Option<i64>, Option<f64>)> {
    let mut rows = Vec::new();
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        match source.poll(10_000, Duration::from_millis(50)).unwrap() {
            SourceEvent::Chunk(c) => {
                let Payload::Arrow(b) = c.payload else {
                    panic!("the webhook source hands out typed rows");
                };
                assert_eq!(b.schema(), schema());
                let id = b.column(0).as_string::<i32>();
                let n = b.column(1).as_primitive::<Int64Type>();
                let a = b.column(2).as_primitive::<Float64Type>();
                for i in 0..b.num_rows() {
                    rows.push((
                        id.value(i).to_string(),
                        n.is_valid(i).then(|| n.value(i)),
                        a.is_valid(i).then(|| a.value(i)),
                    ));
                }
            }
            _ if !rows.is_empty() => break,
            _ => {}
        }
    }
    rows
}

#[test]
fn hostile_requests_get_their_status_and_good_events_all_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let mut source = open("&max_body=64KiB", dir.path());
    let addr = source.local_addr().expect("served");
    let mut sent_good = 0usize;
    let mut send_good = |addr| {
        let (status, body) = post(addr, good(sent_good).as_bytes());
        assert_eq!(status, 200, "{body}");
        sent_good += 1;
    };

    // (body, content-encoding, status, reason, event index, field)
    type Case<'a> = (
        Vec<u8>,
        Option<&'a str>,
        u16,
        &'a str,
        Option<u64>,
        Option<&'a str>,
    );
    let bomb = gzip(&vec![b' '; 4 << 20]);
    let mut bad_gzip = gzip(good(0).as_bytes());
    let n = bad_gzip.len();
    bad_gzip[n - 6] ^= 0xff; // the CRC no longer matches
    let deep = format!(
        r#"{{"id":"d","x":{}1{}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let cases: Vec<Case> = vec![
        // Bad UTF-8 inside a string, in the second event of three: the
        // request is atomic, so the first is not stored either.
        (
            [
                good(900).as_bytes(),
                b"\n{\"id\":\"a\xff\xfeb\"}\n",
                good(901).as_bytes(),
            ]
            .concat(),
            None,
            400,
            "bad_event",
            Some(1),
            Some("id"),
        ),
        (
            br#"{"id":"w","n":"twelve"}"#.to_vec(),
            None,
            400,
            "bad_event",
            Some(0),
            Some("n"),
        ),
        (
            br#"{"id":"w","amount":{"v":1}}"#.to_vec(),
            None,
            400,
            "bad_event",
            Some(0),
            Some("amount"),
        ),
        (
            br#"{"id":"t","ts":"yesterday"}"#.to_vec(),
            None,
            400,
            "bad_event",
            Some(0),
            Some("ts"),
        ),
        (
            deep.into_bytes(),
            None,
            400,
            "bad_event",
            Some(0),
            Some("x"),
        ),
        (
            br#"{"id":"h","n":123456789012345678901234567890}"#.to_vec(),
            None,
            400,
            "bad_event",
            Some(0),
            Some("n"),
        ),
        (
            br#"{"id":"h","amount":1e400}"#.to_vec(),
            None,
            400,
            "bad_event",
            Some(0),
            Some("amount"),
        ),
        (
            br#"[{"id":"o"}, 42]"#.to_vec(),
            None,
            400,
            "not_an_object",
            None,
            None,
        ),
        (
            br#""just a string""#.to_vec(),
            None,
            400,
            "not_an_object",
            None,
            None,
        ),
        (bomb, Some("gzip"), 413, "too_large", None, None),
        (bad_gzip, Some("gzip"), 400, "gzip", None, None),
        (
            b"\x1f\x8b\x08garbage".to_vec(),
            Some("gzip"),
            400,
            "gzip",
            None,
            None,
        ),
        (
            br#"{"id":"m","n":}"#.to_vec(),
            None,
            400,
            "malformed_json",
            None,
            None,
        ),
    ];
    for (body, encoding, status, reason, event, field) in cases {
        send_good(addr);
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(e) = encoding {
            headers.push(("Content-Encoding", e));
        }
        let (got, reply) = post_with(addr, &headers, &body);
        assert_eq!(got, status, "{reply}");
        let reply = json(&reply);
        assert_eq!(reply["reason"], reason, "{reply}");
        assert!(reply["error"].as_str().is_some_and(|e| !e.is_empty()));
        if let Some(i) = event {
            assert_eq!(reply["event"], i, "{reply}");
            assert_eq!(reply["field"], field.unwrap(), "{reply}");
            assert!(reply["detail"].as_str().is_some_and(|d| !d.is_empty()));
        }
    }

    // Duplicate keys: accepted, the last one wins.
    let (status, reply) = post(addr, br#"{"id":"dup","n":1,"n":2}"#);
    assert_eq!(status, 200, "{reply}");

    // Header garbage: the HTTP layer answers 400 (or hangs up); the
    // endpoint keeps serving.
    for garbage in [
        &b"POST /hooks HTTP/1.1\r\nHost: t\r\nX-Bad\x01: \xff\r\nContent-Length: 2\r\n\r\n{}"[..],
        &b"\x00\xff\xfe GARBAGE\r\n\r\n"[..],
        &b"POST /hooks HTTP/1.1\r\nContent-Length: -5\r\n\r\n"[..],
        &b"POST /hooks HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}"[..],
    ] {
        send_good(addr);
        let (status, _) = exchange(addr, garbage);
        assert!(matches!(status, 0 | 400), "header garbage got {status}");
    }
    let (status, reply) = post_with(addr, &[("Content-Type", "text/csv")], b"a,b");
    assert_eq!(status, 415, "{reply}");

    // A slow client holding 200 connections open, headers half sent:
    // good requests are still served, promptly.
    let slow: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"POST /hooks HTTP/1.1\r\nHost: t\r\nContent-Le")
                .unwrap();
            s
        })
        .collect();
    let t = Instant::now();
    for _ in 0..5 {
        send_good(addr);
    }
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "good requests waited {:?} behind slow clients",
        t.elapsed()
    );
    drop(slow);
    send_good(addr);

    let rows = drain(&mut source, Duration::from_secs(5));
    let ids: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let want: Vec<String> = (0..sent_good).map(|i| format!("good-{i}")).collect();
    let mut got_good: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|i| i.starts_with("good-"))
        .collect();
    got_good.sort_unstable_by_key(|i| i[5..].parse::<usize>().unwrap());
    assert_eq!(
        got_good, want,
        "every good event arrives once, none of a refused request"
    );
    let others: Vec<_> = rows.iter().filter(|r| !r.0.starts_with("good-")).collect();
    assert_eq!(others, vec![&("dup".to_string(), Some(2), None)]);
}

#[test]
fn a_buffer_of_another_schema_is_refused_and_a_replay_yields_typed_rows() {
    let dir = tempfile::tempdir().unwrap();
    {
        let source = open("", dir.path());
        let body = format!("{}\n{}", good(1), good(2));
        assert_eq!(
            post(source.local_addr().expect("served"), body.as_bytes()).0,
            200
        );
    }
    // Replayed with the same schema: the rows, typed.
    {
        let mut source = open("", dir.path());
        let rows = drain(&mut source, Duration::from_secs(3));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1], ("good-2".to_string(), Some(2), Some(1.5)));
    }
    // Another schema: refused, naming both.
    let other = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
    let owner = BufferOwner {
        default_dir: dir.path().join("buf"),
        identity: "test".into(),
    };
    let e = WebhookSource::open("webhook://127.0.0.1:0/hooks", &owner, Some(other))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("another shape") && e.contains("id Int64"), "{e}");
    // No schema: refused with what to write.
    let e = WebhookSource::open("webhook://127.0.0.1:0/hooks", &owner, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--schema"), "{e}");
}

#[test]
fn dedupe_ids_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let opts = "&dedupe=id";
    {
        let source = open(opts, dir.path());
        let r = post(
            source.local_addr().expect("served"),
            format!("[{},{}]", good(1), good(2)).as_bytes(),
        );
        assert_eq!(json(&r.1)["accepted"], 2);
    }
    let mut source = open(opts, dir.path());
    let r = post(
        source.local_addr().expect("served"),
        format!("[{},{}]", good(2), good(3)).as_bytes(),
    );
    assert_eq!(
        json(&r.1),
        serde_json::json!({"accepted": 1, "duplicates": 1})
    );
    let rows = drain(&mut source, Duration::from_secs(3));
    let ids: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(ids, vec!["good-1", "good-2", "good-3"]);
}

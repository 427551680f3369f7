//! Several webhook paths on one port: each path is its own source with its
//! own auth, schema and buffer; one listener routes between them, refuses a
//! path opened twice, and stops when its last path closes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use ubik_connector::{Payload, Source, SourceEvent};
use ubik_webhook::{BufferOwner, WebhookSource};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn schema(columns: &[(&str, DataType)]) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, t)| Field::new(*n, t.clone(), true))
            .collect::<Vec<_>>(),
    ))
}

fn open(url: &str, dir: &std::path::Path, schema: SchemaRef) -> Result<WebhookSource, String> {
    let owner = BufferOwner {
        default_dir: dir.to_path_buf(),
        identity: "test".into(),
    };
    WebhookSource::open(url, &owner, Some(schema)).map_err(|e| e.to_string())
}

/// One HTTP exchange: (status, body); status 0 when nothing answered.
fn request(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
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

/// The first column of every row the source hands out within `wait`.
fn ids(source: &mut WebhookSource, wait: Duration) -> Vec<String> {
    let mut out = Vec::new();
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let SourceEvent::Chunk(c) = source.poll(1000, Duration::from_millis(50)).unwrap() {
            let Payload::Arrow(b) = c.payload else {
                panic!("webhook rows are typed");
            };
            out.extend(
                b.column(0)
                    .as_string::<i32>()
                    .iter()
                    .map(|v| v.unwrap_or_default().to_string()),
            );
        } else if !out.is_empty() {
            break;
        }
    }
    out
}

#[test]
fn two_paths_on_one_port_are_two_sources_with_their_own_auth_and_schema() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let base = format!("webhook://127.0.0.1:{port}");
    let orders_schema = schema(&[("id", DataType::Utf8), ("amount", DataType::Float64)]);
    let merchants_schema = schema(&[("id", DataType::Utf8), ("region", DataType::Utf8)]);
    let mut orders = open(
        &format!(
            "{base}/orders?max_interval=10ms&auth=bearer&secret=file:{}",
            token.display()
        ),
        &dir.path().join("orders"),
        orders_schema.clone(),
    )
    .unwrap();
    let mut merchants = open(
        &format!("{base}/merchants?max_interval=10ms"),
        &dir.path().join("merchants"),
        merchants_schema,
    )
    .unwrap();
    assert_eq!(orders.local_addr(), merchants.local_addr());

    let auth = "Authorization: Bearer s3cret\r\n";
    // Each path checks its own auth...
    let (status, body) = request(addr, "POST", "/orders", "", r#"{"id":"o1","amount":1}"#);
    assert_eq!(status, 401, "{body}");
    let (status, body) = request(
        addr,
        "POST",
        "/merchants",
        "",
        r#"{"id":"m1","region":"eu"}"#,
    );
    assert_eq!(status, 200, "{body}");
    // ...and decodes with its own schema: a region is no amount.
    let (status, body) = request(
        addr,
        "POST",
        "/orders",
        auth,
        r#"{"id":"o1","amount":"eu"}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("amount"), "{body}");
    let (status, body) = request(
        addr,
        "POST",
        "/orders/",
        auth,
        r#"{"id":"o1","amount":1.5}"#,
    );
    assert_eq!(status, 200, "{body}");

    let (status, body) = request(addr, "POST", "/nowhere", "", "{}");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("/merchants, /orders"), "{body}");
    let (status, _) = request(addr, "GET", "/orders", "", "");
    assert_eq!(status, 405);
    let (status, metrics) = request(addr, "GET", "/metrics", "", "");
    assert_eq!(status, 200);
    assert!(
        metrics.contains(r#"ubik_webhook_events_total{path="/orders"} 1"#)
            && metrics.contains(r#"ubik_webhook_events_total{path="/merchants"} 1"#),
        "{metrics}"
    );

    assert_eq!(ids(&mut orders, Duration::from_secs(5)), ["o1"]);
    assert_eq!(ids(&mut merchants, Duration::from_secs(5)), ["m1"]);

    // A path is served once.
    let Err(twice) = open(
        &format!("{base}/orders"),
        &dir.path().join("again"),
        orders_schema,
    ) else {
        panic!("a path opened twice is refused");
    };
    assert!(twice.contains("opened twice"), "{twice}");

    // Closing one path leaves the other served; closing the last frees the port.
    drop(merchants);
    let (status, _) = request(
        addr,
        "POST",
        "/merchants",
        "",
        r#"{"id":"m2","region":"eu"}"#,
    );
    assert_eq!(status, 404);
    let (status, body) = request(addr, "POST", "/orders", auth, r#"{"id":"o2","amount":2}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&mut orders, Duration::from_secs(5)), ["o2"]);
    drop(orders);
    assert!(TcpListener::bind(addr).is_ok(), "the port is released");
}

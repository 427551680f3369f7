//! A webhook pipeline killed with SIGKILL while clients post, restarted,
//! finally stopped with SIGTERM: every acknowledged event is in the output
//! (the typed buffer replays what no checkpoint covered), and an event
//! emitted twice is emitted with the same bytes. And two paths on one port
//! feed two tables of one pipeline.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const SCHEMA: &str = "id BIGINT, kind VARCHAR, ts TIMESTAMP";

/// POSTs one event; true if it was acknowledged (200).
fn post(port: u16, i: u64) -> bool {
    let body = format!(
        r#"{{"id":{i},"kind":"charge","ts":"2024-01-01T00:00:{:02}Z"}}"#,
        i % 60
    );
    post_to(port, "/hooks", &body)
}

/// POSTs `body` to `path`; true if it was acknowledged (200).
fn post_to(port: u16, path: &str, body: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out.starts_with(b"HTTP/1.1 200")
}

fn wait_up(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            if out.starts_with(b"HTTP/1.1 200") {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the endpoint on {port} did not come up");
}

fn send_signal(pid: u32, signal: i32) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn kill_9_while_clients_post_loses_no_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!(
        "webhook://127.0.0.1:{port}/hooks?buffer={}&max_rows=20&max_interval=50ms",
        dir.path().join("buf").display()
    );
    let ck = dir.path().join("ck");
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (acked, next, stop) = (acked.clone(), next.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if post(port, i) {
                        acked.lock().unwrap().insert(i);
                    } else {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            })
        })
        .collect();
    let mut outputs = Vec::new();
    for round in 0..5 {
        let mut child = ubik()
            .args(["run", "SELECT id, kind FROM hooks", "--from", &url])
            .args(["--schema", SCHEMA, "--checkpoint"])
            .arg(&ck)
            .args(["--checkpoint-interval", "100ms", "-q"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_up(port);
        std::thread::sleep(Duration::from_millis(400 + 150 * round));
        if round < 4 {
            send_signal(child.id(), 9);
        } else {
            stop.store(true, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(500));
            send_signal(child.id(), 15);
        }
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let status = child.wait().unwrap();
        if round == 4 {
            let err = child_stderr(&mut child);
            assert!(status.success(), "{err}");
        }
        outputs.push(out);
    }
    for c in clients {
        c.join().unwrap();
    }
    let mut seen: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    // A kill can cut a run's last line anywhere, even right after a `}` of
    // its key: only lines ended by a newline are complete.
    for line in outputs
        .iter()
        .flat_map(|o| o[..o.rfind('\n').unwrap_or(0)].lines())
    {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = v["value"]["id"].as_u64().unwrap();
        seen.entry(id).or_default().insert(line.to_string());
    }
    let acked = acked.lock().unwrap();
    assert!(
        acked.len() > 100,
        "only {} events were acknowledged",
        acked.len()
    );
    let missing: Vec<_> = acked.iter().filter(|i| !seen.contains_key(i)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged events lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(
        seen.values().all(|v| v.len() == 1),
        "an event was emitted twice with different bytes"
    );
}

#[test]
fn two_paths_on_one_port_feed_a_join_of_two_tables() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let at = |t: u64| {
        format!(
            "2024-01-01T{:02}:{:02}:{:02}Z",
            t / 3600,
            t / 60 % 60,
            t % 60
        )
    };
    let child = ubik()
        .current_dir(dir.path())
        .args([
            "run",
            "SELECT p.id AS payment, o.id AS order_id FROM payments p JOIN orders o \
             ON p.order_id = o.id AND p.ts BETWEEN o.ts AND o.ts + INTERVAL '1' HOUR",
        ])
        .args([
            "--from",
            &format!("orders=webhook://127.0.0.1:{port}/orders?max_interval=20ms"),
        ])
        .args([
            "--from",
            &format!("payments=webhook://127.0.0.1:{port}/payments?max_interval=20ms"),
        ])
        .args(["--schema", "orders=id BIGINT, ts TIMESTAMP"])
        .args([
            "--schema",
            "payments=id BIGINT, order_id BIGINT, ts TIMESTAMP",
        ])
        .args(["--lateness", "0s", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_up(port);
    // Order i at minute i; its payment 0, 20, 40 or 60 minutes and a
    // second later: the last is outside the hour and finds no order. Each
    // table is posted in time order, then one late-night pair moves both
    // watermarks past every payment.
    let mut expected = BTreeSet::new();
    let mut payments = Vec::new();
    for i in 0..40u64 {
        let order = format!(r#"{{"id":{i},"ts":"{}"}}"#, at(i * 60));
        assert!(post_to(port, "/orders", &order));
        let delay = (i % 4) * 1200 + u64::from(i % 4 == 3);
        payments.push((i * 60 + delay, 1000 + i, i));
        if i % 4 != 3 {
            expected.insert((1000 + i, i));
        }
    }
    payments.sort();
    payments.push((23 * 3600, 2000, 2000));
    for (ts, id, order) in payments {
        let payment = format!(r#"{{"id":{id},"order_id":{order},"ts":"{}"}}"#, at(ts));
        assert!(post_to(port, "/payments", &payment));
    }
    assert!(post_to(
        port,
        "/orders",
        &format!(r#"{{"id":2000,"ts":"{}"}}"#, at(23 * 3600))
    ));
    // A table's events are refused at the other table's path.
    assert!(!post_to(
        port,
        "/orders",
        r#"{"id":1,"order_id":1,"ts":"nope"}"#
    ));
    std::thread::sleep(Duration::from_millis(500));
    send_signal(child.id(), 15);
    let output = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{err}");
    let got: BTreeSet<(u64, u64)> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["value"]["payment"].as_u64().unwrap(),
                v["value"]["order_id"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, expected, "{err}");
}

//! The live status page of `--metrics`: `/` serves the page, `/status.json`
//! the figures it draws, and they move with the pipeline and agree with
//! `/metrics`; a real browser (headless Chromium, `UBIK_CHROMIUM`, which
//! the test command installs) renders the page and its numbers.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn status(port: u16) -> Value {
    let (code, kind, body) = http_get(port, "/status.json").expect("status.json answers");
    assert_eq!(code, 200);
    assert!(kind.starts_with("application/json"), "{kind}");
    serde_json::from_str(&body).unwrap()
}

/// A Prometheus sample's value (the first line that starts with `name`).
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

/// A running pipeline with a status page on `port`: an unbounded demo
/// source paced in real time, with late rows (dead letters) and a
/// checkpoint every second. Returns once its first checkpoint is written.
struct Running {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> (Running, Value) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Dead letters go to stderr: into a file, so that no pipe fills up.
    let log = dir.path().join("stderr.log");
    let child = ubik()
        .args([
            "run",
            "SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')",
            "--from",
            "demo://orders?count=0&rate=3000&realtime=1&late=0.02&disorder=0.2",
            "--lateness",
            "1s",
            "--retention",
            "0s",
            "--checkpoint",
            dir.path().join("ck").to_str().unwrap(),
            "--checkpoint-interval",
            "1s",
            "--metrics",
            &format!("127.0.0.1:{port}"),
            "-q",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        assert!(Instant::now() < deadline, "no status: {}", log());
        if let Some((200, _, _)) = http_get(port, "/status.json") {
            let s = status(port);
            if s["started"] == true && s["checkpoint"]["count"].as_u64() >= Some(1) {
                break s;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    (
        Running {
            child,
            port,
            _dir: dir,
        },
        first,
    )
}

#[test]
fn status_page_moves_with_the_pipeline_and_agrees_with_metrics() {
    let (running, first) = start();
    let port = running.port;
    std::thread::sleep(Duration::from_millis(2500));
    let second = status(port);
    let (_, _, metrics) = http_get(port, "/metrics").unwrap();
    let (code, kind, page) = http_get(port, "/").unwrap();
    let (missing, _, _) = http_get(port, "/nope").unwrap();
    drop(running);

    assert_eq!((code, missing), (200, 404));
    assert!(kind.starts_with("text/html"), "{kind}");
    for id in [
        "records-in",
        "changes-out",
        "watermark",
        "partitions",
        "chart",
    ] {
        assert!(
            page.contains(&format!("id=\"{id}\"")),
            "the page lacks #{id}"
        );
    }
    assert!(page.contains("status.json"));

    // The plan is the query's.
    assert_eq!(second["plan"]["kind"], "windowed (TUMBLE) aggregation");
    assert_eq!(second["plan"]["key"], serde_json::json!(["merchant", "w"]));
    // The figures move.
    let records = |s: &Value| s["totals"]["records_in"].as_u64().unwrap();
    assert!(records(&second) > records(&first), "{first}\n{second}");
    assert!(
        second["history"].as_array().unwrap().len() > first["history"].as_array().unwrap().len()
    );
    let watermark = |s: &Value| s["partitions"][0]["watermark_ms"].as_i64().unwrap();
    assert!(watermark(&second) > watermark(&first));
    assert!(second["operators"][0]["keys"].as_u64().unwrap() > 0);
    assert!(second["checkpoint"]["age_s"].as_f64().unwrap() < 5.0);
    // Late rows reach the dead letters, by reason.
    assert!(
        second["dead_letters"]["by_reason"]["late"]
            .as_u64()
            .unwrap()
            > 0,
        "{second}"
    );
    // /metrics, read after the status, is at or past it.
    assert!(sample(&metrics, "ubik_records_in_total") >= records(&second) as f64);
    let partition = sample(&metrics, "ubik_partition_watermark_seconds{");
    assert!(partition * 1000.0 >= watermark(&second) as f64);
    assert!(sample(&metrics, "ubik_dead_letters_by_reason{reason=\"late\"}") > 0.0);
}

/// The text of the element `id` in a dumped DOM.
fn element(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no #{id} in the page"));
    let rest = &dom[at + id.len() + 6..];
    rest[..rest.find('<').unwrap()].to_string()
}

/// Headless Chromium renders the page of a running pipeline: the numbers
/// it shows move, lie between the `/metrics` figures read before and after
/// it, and a screenshot is kept under the target directory.
#[test]
fn a_browser_renders_the_status_page() {
    let skipped =
        std::env::var("UBIK_TEST_SKIP").is_ok_and(|s| s.split(',').any(|s| s == "browser"));
    let Some(chromium) = std::env::var_os("UBIK_CHROMIUM").filter(|_| !skipped) else {
        assert!(
            skipped || std::env::var_os("CI").is_none(),
            "UBIK_CHROMIUM is not set (scripts/test.sh sets it)"
        );
        eprintln!("skipped: set UBIK_CHROMIUM to a Chromium binary");
        return;
    };
    let (running, _) = start();
    let url = format!("http://127.0.0.1:{}/", running.port);
    let browser = |extra: &[&str]| {
        let o = std::process::Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=3000",
            ])
            .args(extra)
            .arg(&url)
            .output()
            .expect("run chromium");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let metric = || {
        sample(
            &http_get(running.port, "/metrics").unwrap().2,
            "ubik_records_in_total",
        )
    };
    let mut shown = Vec::new();
    for _ in 0..2 {
        let before = metric();
        let dom = browser(&["--dump-dom"]);
        let after = metric();
        let records: f64 = element(&dom, "records-in").parse().unwrap();
        assert!(
            before <= records && records <= after,
            "{before} <= {records} <= {after}"
        );
        assert!(element(&dom, "watermark").starts_with("20"), "{dom}");
        assert!(dom.contains("windowed (TUMBLE) aggregation") && dom.contains("<td>late</td>"));
        shown.push(records);
        std::thread::sleep(Duration::from_millis(1500));
    }
    assert!(
        shown[1] > shown[0],
        "the page's numbers do not move: {shown:?}"
    );
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    browser(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=1280,1000",
    ]);
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    eprintln!("status page screenshot: {}", shot.display());
}

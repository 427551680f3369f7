//! `webhook://HOST:PORT/PATH?option=value&...`. The SQL table name is the
//! path's last segment (`webhook://0.0.0.0:8080/hooks` feeds table `hooks`).
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `buffer` | the pipeline's own (see [`crate::BufferOwner`]) | directory of the durable buffer, or `memory` (no durability) |
//! | `max_rows` | 10000 | a flush holds at most this many events ... |
//! | `max_bytes` | 8MiB | ... and at most this many event bytes as received ... |
//! | `max_interval` | 1s | ... and waits at most this long for more |
//! | `segment_bytes` | 64MiB | roll buffer segments at this size |
//! | `max_buffer_bytes` | 1GiB | unread bytes above which requests get 429 |
//! | `max_body` | 10MiB | larger requests get 413 (after gunzip too) |
//! | `auth` | none | `stripe`, `github`, `hmac`, `bearer` |
//! | `secret` | | `env:NAME` or `file:PATH` (never the secret itself) |
//! | `header` | | the signature header of `auth=hmac` |
//! | `tolerance` | 300s | accepted age of a Stripe signature timestamp |
//! | `dedupe` | | JSON field holding an event id: repeats are acknowledged, not stored |
//! | `dedupe_window` | 24h | how long an event id is remembered |
//! | `end` | | `latest`: a bounded run over what the buffer holds when the source opens; nothing is received, no port is bound (Python's one-shot `stream()` sets it) |

use std::path::PathBuf;
use std::time::Duration;

use ubik_connector::time::parse_duration;

use crate::error::Error;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    /// `Stripe-Signature: t=<unix>,v1=<hex hmac-sha256 of "t.payload">`.
    Stripe {
        secret: Vec<u8>,
        tolerance: Duration,
    },
    /// `X-Hub-Signature-256: sha256=<hex hmac-sha256 of payload>`.
    GitHub {
        secret: Vec<u8>,
    },
    /// `<header>: <hex or base64 hmac-sha256 of payload>` (an optional `sha256=` prefix).
    Hmac {
        secret: Vec<u8>,
        header: String,
    },
    /// `Authorization: Bearer <token>`.
    Bearer {
        token: Vec<u8>,
    },
}

#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub bind: String,
    pub path: String,
    pub table: String,
    /// `None`: memory only. Unless `buffer=` was given, the pipeline's own
    /// directory replaces this default when the source opens.
    pub buffer_dir: Option<PathBuf>,
    /// Whether `buffer=` named the directory (or `memory`).
    pub buffer_given: bool,
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_interval: Duration,
    pub segment_bytes: u64,
    pub max_buffer_bytes: u64,
    pub max_body: usize,
    pub auth: Auth,
    pub dedupe: Option<String>,
    pub dedupe_window: Duration,
    /// `end=latest`: read the events buffered when the source opens, then
    /// end; the endpoint is not served.
    pub ends: bool,
}

fn bytes(v: &str) -> Option<u64> {
    let t = v.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mul = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// Reads a secret from `env:NAME` or `file:PATH`.
pub fn read_secret(spec: &str) -> Result<Vec<u8>, Error> {
    if let Some(name) = spec.strip_prefix("env:") {
        return std::env::var(name).map(|s| s.into_bytes()).map_err(|_| {
            Error::Config(format!(
                "secret=env:{name}: the environment variable is not set"
            ))
        });
    }
    if let Some(path) = spec.strip_prefix("file:") {
        return std::fs::read(path)
            .map(|mut b| {
                while b.last().is_some_and(|c| c.is_ascii_whitespace()) {
                    b.pop();
                }
                b
            })
            .map_err(|e| Error::Config(format!("secret=file:{path}: {e}")));
    }
    Err(Error::Config(
        "secret must be env:NAME or file:PATH: secrets are never given on the command line".into(),
    ))
}

impl WebhookConfig {
    pub fn parse(url: &str) -> Result<Self, Error> {
        let rest = url
            .strip_prefix("webhook://")
            .ok_or_else(|| Error::Config(format!("{url:?} is not a webhook:// URL")))?;
        let (addr_path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bind, path) = addr_path.split_once('/').ok_or_else(|| {
            Error::Config(format!(
                "{url:?} has no path: use webhook://0.0.0.0:8080/hooks"
            ))
        })?;
        let path = format!("/{}", path.trim_end_matches('/'));
        let table = path.rsplit('/').next().unwrap_or_default().to_string();
        if table.is_empty() || bind.is_empty() {
            return Err(Error::Config(format!(
                "{url:?} is not webhook://HOST:PORT/PATH"
            )));
        }
        let mut c = WebhookConfig {
            bind: bind.to_string(),
            path,
            buffer_dir: Some(PathBuf::from(format!("ubik-webhook-{table}"))),
            buffer_given: false,
            table,
            max_rows: 10_000,
            max_bytes: 8 << 20,
            max_interval: Duration::from_secs(1),
            segment_bytes: 64 << 20,
            max_buffer_bytes: 1 << 30,
            max_body: 10 << 20,
            auth: Auth::None,
            dedupe: None,
            dedupe_window: Duration::from_secs(86_400),
            ends: false,
        };
        let (mut auth, mut secret, mut header, mut tolerance) =
            (None, None, None, Duration::from_secs(300));
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = || Error::Config(format!("webhook:// option {k}={v:?} is not valid"));
            let dur = |v: &str| {
                parse_duration(v)
                    .map(|us| Duration::from_micros(us.max(0) as u64))
                    .ok_or_else(bad)
            };
            match k {
                "buffer" if v == "memory" => (c.buffer_dir, c.buffer_given) = (None, true),
                "buffer" => (c.buffer_dir, c.buffer_given) = (Some(PathBuf::from(v)), true),
                "max_rows" => c.max_rows = v.parse().map_err(|_| bad())?,
                "max_bytes" => c.max_bytes = bytes(v).ok_or_else(bad)? as usize,
                "max_interval" => c.max_interval = dur(v)?,
                "segment_bytes" => c.segment_bytes = bytes(v).ok_or_else(bad)?,
                "max_buffer_bytes" => c.max_buffer_bytes = bytes(v).ok_or_else(bad)?,
                "max_body" => c.max_body = bytes(v).ok_or_else(bad)? as usize,
                "auth" => auth = Some(v.to_string()),
                "secret" => secret = Some(read_secret(v)?),
                "header" => header = Some(v.to_string()),
                "tolerance" => tolerance = dur(v)?,
                "dedupe" => c.dedupe = Some(v.to_string()),
                "dedupe_window" => c.dedupe_window = dur(v)?,
                "end" if v == "latest" => c.ends = true,
                "end" => return Err(bad()),
                other => {
                    return Err(Error::Config(format!(
                        "unknown webhook:// option {other:?} (known: buffer, max_rows, max_bytes, max_interval, segment_bytes, max_buffer_bytes, max_body, auth, secret, header, tolerance, dedupe, dedupe_window, end=latest)"
                    )));
                }
            }
        }
        if c.max_rows == 0 || c.max_bytes == 0 {
            return Err(Error::Config(
                "max_rows and max_bytes must be positive".into(),
            ));
        }
        let need_secret = |s: Option<Vec<u8>>| {
            s.ok_or_else(|| {
                Error::Config("this auth needs secret=env:NAME or secret=file:PATH".into())
            })
        };
        c.auth = match auth.as_deref() {
            None | Some("none") => Auth::None,
            Some("stripe") => Auth::Stripe {
                secret: need_secret(secret)?,
                tolerance,
            },
            Some("github") => Auth::GitHub {
                secret: need_secret(secret)?,
            },
            Some("hmac") => Auth::Hmac {
                secret: need_secret(secret)?,
                header: header
                    .ok_or_else(|| Error::Config("auth=hmac needs header=<name>".into()))?,
            },
            Some("bearer") => Auth::Bearer {
                token: need_secret(secret)?,
            },
            Some(other) => {
                return Err(Error::Config(format!(
                    "auth={other:?} is not stripe, github, hmac or bearer"
                )));
            }
        };
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options() {
        let c = WebhookConfig::parse("webhook://127.0.0.1:0/api/hooks?max_rows=5&max_bytes=1MiB&max_interval=250ms&buffer=memory").unwrap();
        assert_eq!(
            (c.table.as_str(), c.path.as_str(), c.max_rows, c.max_bytes),
            ("hooks", "/api/hooks", 5, 1 << 20)
        );
        assert_eq!(c.max_interval, Duration::from_millis(250));
        assert!(c.buffer_dir.is_none());
        assert!(WebhookConfig::parse("webhook://h:1/x?auth=stripe&secret=whsec_plain").is_err());
        assert!(WebhookConfig::parse("webhook://h:1/x?nope=1").is_err());
        assert!(
            WebhookConfig::parse("webhook://h:1/x?end=latest")
                .unwrap()
                .ends
        );
        assert!(WebhookConfig::parse("webhook://h:1/x?end=soon").is_err());
    }
}

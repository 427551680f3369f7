//! A client of a Confluent-compatible schema registry (Confluent's own,
//! Apicurio's `ccompat` API, Redpanda's, Karapace): schemas by id, a
//! subject's latest version, registration and compatibility checks.
//!
//! Settings come from the URL (`registry=`) and from the same `-X` layer
//! as librdkafka's, under the names Confluent's clients use with a
//! `schema.registry.` prefix, which librdkafka never sees:
//!
//! | setting | meaning |
//! |---|---|
//! | `schema.registry.url` | the base URL, when the source or sink URL has no `registry=` |
//! | `schema.registry.basic.auth.user.info` | `user:password` for HTTP basic auth |
//! | `schema.registry.bearer.auth.token` | a bearer token |
//! | `schema.registry.ssl.ca.location` | a PEM file of the CAs to trust for `https://` |
//!
//! An unreachable registry (refused, timed out, a 5xx answer) is
//! [`RegistryError::Unreachable`]: the caller retries it with backoff, like a
//! broker outage ([`Registry::retrying`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tracing::warn;
use ureq::Agent;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};

use crate::error::{AvroError, Result};

/// The prefix of registry settings in the `-X` map.
pub const SETTING_PREFIX: &str = "schema.registry.";

/// Why a registry request failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Refused, timed out or a server error: worth retrying.
    #[error("schema registry {url} is unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    /// The registry has no such schema id or subject.
    #[error("{0}")]
    NotFound(String),
    /// Any other answer: wrong credentials, an invalid schema.
    #[error("schema registry {url} answered {status}: {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
}

/// A subject's registered schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub id: u32,
    pub version: Option<i64>,
    pub schema: String,
}

/// A Confluent-compatible registry at one base URL.
#[derive(Clone)]
pub struct Registry {
    base: String,
    agent: Agent,
    authorization: Option<String>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({})", self.base)
    }
}

impl Registry {
    /// A client of the registry at `url` (or `schema.registry.url`), with
    /// auth and TLS from `settings` (the `-X` map; other keys are ignored).
    pub fn new(url: Option<&str>, settings: &BTreeMap<String, String>) -> Result<Self> {
        let setting = |name: &str| settings.get(&format!("{SETTING_PREFIX}{name}"));
        let base = url
            .map(str::to_string)
            .or_else(|| setting("url").cloned())
            .ok_or_else(|| {
                AvroError::Config(
                    "format=avro needs a schema registry: add registry=http://host:port to the URL, or -X schema.registry.url=..."
                        .into(),
                )
            })?;
        if !base.starts_with("http://") && !base.starts_with("https://") {
            return Err(AvroError::Config(format!(
                "registry={base:?} is not an http:// or https:// URL"
            )));
        }
        let mut tls = TlsConfig::builder().provider(TlsProvider::NativeTls);
        if let Some(path) = setting("ssl.ca.location") {
            let pem = std::fs::read(path).map_err(|e| {
                AvroError::Config(format!(
                    "schema.registry.ssl.ca.location={path:?} cannot be read: {e}"
                ))
            })?;
            let certs = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<std::result::Result<Vec<Certificate<'static>>, _>>()
                .map_err(|e| {
                    AvroError::Config(format!(
                        "schema.registry.ssl.ca.location={path:?} is not PEM certificates: {e}"
                    ))
                })?;
            tls = tls.root_certs(RootCerts::new_with_certs(&certs));
        }
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .tls_config(tls.build())
            .build()
            .into();
        let authorization = match (
            setting("basic.auth.user.info"),
            setting("bearer.auth.token"),
        ) {
            (Some(_), Some(_)) => {
                return Err(AvroError::Config(
                    "set one of schema.registry.basic.auth.user.info and schema.registry.bearer.auth.token, not both".into(),
                ));
            }
            (Some(user_info), None) => {
                let mut header = b"Basic ".to_vec();
                ubik_format::changelog::base64(&mut header, user_info.as_bytes());
                Some(String::from_utf8(header).expect("base64 is ASCII"))
            }
            (None, Some(token)) => Some(format!("Bearer {token}")),
            (None, None) => None,
        };
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            agent,
            authorization,
        })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// The schema registered under `id`.
    pub fn schema_by_id(&self, id: u32) -> Result<String, RegistryError> {
        let body = self.request("GET", &format!("/schemas/ids/{id}"), None)?;
        field_str(&body, "schema").ok_or_else(|| self.malformed(&body))
    }

    /// The latest schema of `subject`.
    pub fn latest(&self, subject: &str) -> Result<Registered, RegistryError> {
        let body = self.request("GET", &format!("/subjects/{subject}/versions/latest"), None)?;
        self.registered(&body)
    }

    /// Registers `schema` under `subject` (a no-op returning the same id
    /// when it is registered already) and returns its id.
    pub fn register(&self, subject: &str, schema: &str) -> Result<u32, RegistryError> {
        let request = serde_json::json!({ "schema": schema }).to_string();
        let body = self.request(
            "POST",
            &format!("/subjects/{subject}/versions"),
            Some(&request),
        )?;
        field_u32(&body, "id").ok_or_else(|| self.malformed(&body))
    }

    /// Whether `schema` may follow the latest version of `subject` under
    /// its compatibility rule, with the registry's reasons when not.
    pub fn compatible(
        &self,
        subject: &str,
        schema: &str,
    ) -> Result<(bool, Vec<String>), RegistryError> {
        let request = serde_json::json!({ "schema": schema }).to_string();
        let body = self.request(
            "POST",
            &format!("/compatibility/subjects/{subject}/versions/latest?verbose=true"),
            Some(&request),
        )?;
        let value: serde_json::Value =
            serde_json::from_str(&body).map_err(|_| self.malformed(&body))?;
        let ok = value
            .get("is_compatible")
            .and_then(serde_json::Value::as_bool)
            .ok_or_else(|| self.malformed(&body))?;
        // Confluent's server lists `messages`; Apicurio's gives one `reason`.
        let mut messages: Vec<String> = value
            .get("messages")
            .and_then(serde_json::Value::as_array)
            .map(|m| {
                m.iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(reason) = value.get("reason").and_then(serde_json::Value::as_str) {
            messages.push(reason.to_string());
        }
        Ok((ok, messages))
    }

    /// The compatibility rule of `subject` (its own, else the registry's).
    pub fn compatibility_rule(&self, subject: &str) -> Result<String, RegistryError> {
        let body = match self.request("GET", &format!("/config/{subject}"), None) {
            Err(RegistryError::NotFound(_)) => self.request("GET", "/config", None)?,
            other => other?,
        };
        field_str(&body, "compatibilityLevel")
            .or_else(|| field_str(&body, "compatibility"))
            .ok_or_else(|| self.malformed(&body))
    }

    /// Runs `f` until it returns something other than
    /// [`RegistryError::Unreachable`], waiting 0.5 s, 1 s, ... up to 10 s
    /// between tries, and giving up after `patience` (never, with `None`).
    pub fn retrying<T>(
        &self,
        patience: Option<Duration>,
        mut f: impl FnMut(&Self) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        let started = Instant::now();
        let mut delay = Duration::from_millis(500);
        loop {
            match f(self) {
                Err(e @ RegistryError::Unreachable { .. }) => {
                    if patience.is_some_and(|p| started.elapsed() + delay > p) {
                        return Err(e);
                    }
                    warn!("{e}; retrying in {delay:?}");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
                other => return other,
            }
        }
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<String, RegistryError> {
        let url = format!("{}{path}", self.base);
        let unreachable = |reason: String| RegistryError::Unreachable {
            url: self.base.clone(),
            reason,
        };
        const MEDIA: &str = "application/vnd.schemaregistry.v1+json";
        let response = match (method, body) {
            ("POST", Some(body)) => {
                let mut r = self
                    .agent
                    .post(&url)
                    .header("Accept", MEDIA)
                    .header("Content-Type", MEDIA);
                if let Some(a) = &self.authorization {
                    r = r.header("Authorization", a);
                }
                r.send(body)
            }
            _ => {
                let mut r = self.agent.get(&url).header("Accept", MEDIA);
                if let Some(a) = &self.authorization {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
        };
        let mut response = response.map_err(|e| unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| unreachable(e.to_string()))?;
        match status {
            200..=299 => Ok(text),
            404 => Err(RegistryError::NotFound(
                field_str(&text, "message").unwrap_or_else(|| format!("{path}: not found")),
            )),
            408 | 429 | 500.. => Err(unreachable(format!("HTTP {status}: {text}"))),
            _ => Err(RegistryError::Refused {
                url: url.clone(),
                status,
                body: text,
            }),
        }
    }

    fn registered(&self, body: &str) -> Result<Registered, RegistryError> {
        let value: serde_json::Value =
            serde_json::from_str(body).map_err(|_| self.malformed(body))?;
        Ok(Registered {
            id: value
                .get("id")
                .and_then(serde_json::Value::as_u64)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| self.malformed(body))?,
            version: value.get("version").and_then(serde_json::Value::as_i64),
            schema: value
                .get("schema")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| self.malformed(body))?
                .to_string(),
        })
    }

    fn malformed(&self, body: &str) -> RegistryError {
        RegistryError::Refused {
            url: self.base.clone(),
            status: 200,
            body: format!("an answer that is not the registry API's: {body}"),
        }
    }
}

fn field_str(body: &str, name: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    value.get(name)?.as_str().map(str::to_string)
}

fn field_u32(body: &str, name: &str) -> Option<u32> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    u32::try_from(value.get(name)?.as_u64()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_needs_an_http_url() {
        let none = BTreeMap::new();
        let e = Registry::new(None, &none).unwrap_err().to_string();
        assert!(e.contains("registry=http://host:port"), "{e}");
        let e = Registry::new(Some("localhost:8081"), &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an http"), "{e}");
        let from_settings: BTreeMap<String, String> = [(
            "schema.registry.url".to_string(),
            "http://127.0.0.1:1/".to_string(),
        )]
        .into();
        assert_eq!(
            Registry::new(None, &from_settings).unwrap().url(),
            "http://127.0.0.1:1"
        );
    }

    /// A one-request HTTP server: answers `status` and `body`, hands back the request head.
    fn answer_once(status: u16, body: &'static str) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                head.push_str(&line);
            }
            let mut stream = stream;
            write!(
                stream,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            head
        });
        (url, server)
    }

    #[test]
    fn credentials_from_the_settings_are_sent() {
        for (setting, value, header) in [
            (
                "schema.registry.basic.auth.user.info",
                "alice:s3cret",
                "authorization: Basic YWxpY2U6czNjcmV0",
            ),
            (
                "schema.registry.bearer.auth.token",
                "tok",
                "authorization: Bearer tok",
            ),
        ] {
            let (url, server) = answer_once(200, r#"{"schema":"\"long\""}"#);
            let settings: BTreeMap<String, String> =
                [(setting.to_string(), value.to_string())].into();
            let schema = Registry::new(Some(&url), &settings)
                .unwrap()
                .schema_by_id(3)
                .unwrap();
            assert_eq!(schema, "\"long\"");
            let head = server.join().unwrap().to_lowercase();
            assert!(head.starts_with("get /schemas/ids/3 "), "{head}");
            assert!(head.contains(&header.to_lowercase()), "{head}");
        }
    }

    #[test]
    fn answers_map_to_not_found_unreachable_and_refused() {
        let none = BTreeMap::new();
        let (url, server) = answer_once(404, r#"{"error_code":40403,"message":"no id 9"}"#);
        let e = Registry::new(Some(&url), &none).unwrap().schema_by_id(9);
        assert!(
            matches!(e, Err(RegistryError::NotFound(ref m)) if m == "no id 9"),
            "{e:?}"
        );
        server.join().unwrap();
        let (url, server) = answer_once(503, "busy");
        let e = Registry::new(Some(&url), &none).unwrap().schema_by_id(9);
        assert!(matches!(e, Err(RegistryError::Unreachable { .. })), "{e:?}");
        server.join().unwrap();
        let (url, server) = answer_once(401, "who?");
        let e = Registry::new(Some(&url), &none).unwrap().schema_by_id(9);
        assert!(
            matches!(e, Err(RegistryError::Refused { status: 401, .. })),
            "{e:?}"
        );
        server.join().unwrap();
    }

    #[test]
    fn a_refused_connection_is_unreachable_and_given_up_after_the_patience() {
        let r = Registry::new(Some("http://127.0.0.1:9"), &BTreeMap::new()).unwrap();
        let started = Instant::now();
        let e = r
            .retrying(Some(Duration::from_millis(1600)), |r| r.schema_by_id(1))
            .unwrap_err();
        assert!(matches!(e, RegistryError::Unreachable { .. }), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(1400));
    }
}

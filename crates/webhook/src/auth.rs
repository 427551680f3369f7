//! Request authentication: HMAC-SHA256 signatures (Stripe, GitHub, a
//! generic header) and bearer tokens. Comparisons are constant-time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::config::Auth;

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length")
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Constant-time equality of two byte strings (length may leak).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, String> {
    headers
        .get(name)
        .ok_or_else(|| format!("missing {name} header"))?
        .to_str()
        .map_err(|_| format!("{name} header is not text"))
}

/// Checks `body` (the payload as the sender signed it) against the
/// request's credentials; `Err` holds the reason for a 401.
pub fn verify(
    auth: &Auth,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), String> {
    match auth {
        Auth::None => Ok(()),
        Auth::Bearer { token } => {
            let h = header(headers, "authorization")?;
            let given = h
                .strip_prefix("Bearer ")
                .ok_or("authorization header is not a Bearer token")?;
            if same(given.as_bytes(), token) {
                Ok(())
            } else {
                Err("bearer token does not match".into())
            }
        }
        Auth::GitHub { secret } => {
            let h = header(headers, "x-hub-signature-256")?;
            let sig = h
                .strip_prefix("sha256=")
                .and_then(decode_hex)
                .ok_or("X-Hub-Signature-256 is not sha256=<hex>")?;
            mac(secret)
                .chain_update(body)
                .verify_slice(&sig)
                .map_err(|_| "X-Hub-Signature-256 does not match the payload".to_string())
        }
        Auth::Hmac {
            secret,
            header: name,
        } => {
            let h = header(headers, name)?;
            let h = h.strip_prefix("sha256=").unwrap_or(h);
            let sig = decode_hex(h)
                .or_else(|| base64::engine::general_purpose::STANDARD.decode(h).ok())
                .ok_or_else(|| format!("{name} is not a hex or base64 HMAC-SHA256"))?;
            mac(secret)
                .chain_update(body)
                .verify_slice(&sig)
                .map_err(|_| format!("{name} does not match the payload"))
        }
        Auth::Stripe { secret, tolerance } => {
            let h = header(headers, "stripe-signature")?;
            let mut timestamp = None;
            let mut signatures = Vec::new();
            for part in h.split(',') {
                match part.trim().split_once('=') {
                    Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
                    Some(("v1", s)) => signatures.extend(decode_hex(s)),
                    _ => {}
                }
            }
            let t = timestamp.ok_or("Stripe-Signature has no t= timestamp")?;
            if signatures.is_empty() {
                return Err("Stripe-Signature has no v1= signature".into());
            }
            let now = now
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            if (now - t).unsigned_abs() > tolerance.as_secs() {
                return Err(format!(
                    "Stripe-Signature timestamp is {}s away from now (tolerance {}s): stale or replayed",
                    (now - t).abs(),
                    tolerance.as_secs()
                ));
            }
            let signed = mac(secret)
                .chain_update(t.to_string().as_bytes())
                .chain_update(b".")
                .chain_update(body)
                .finalize()
                .into_bytes();
            if signatures.iter().any(|s| same(s, &signed)) {
                Ok(())
            } else {
                Err("Stripe-Signature does not match the payload".into())
            }
        }
    }
}

/// The default Stripe timestamp tolerance.
pub const STRIPE_TOLERANCE: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn github_documented_vector() {
        // From GitHub's "Validating webhook deliveries" documentation.
        let auth = Auth::GitHub {
            secret: b"It's a Secret to Everybody".to_vec(),
        };
        let h = headers(
            "x-hub-signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        );
        assert!(verify(&auth, &h, b"Hello, World!", SystemTime::now()).is_ok());
        assert!(verify(&auth, &h, b"Hello, World?", SystemTime::now()).is_err());
    }

    #[test]
    fn stripe_scheme_and_tolerance() {
        // Computed independently: python3 -c "import hmac,hashlib; print(hmac.new(b'whsec_test_secret',
        //   b'1700000000.{\"id\":\"evt_1\",\"type\":\"charge.succeeded\"}', hashlib.sha256).hexdigest())"
        let auth = Auth::Stripe {
            secret: b"whsec_test_secret".to_vec(),
            tolerance: STRIPE_TOLERANCE,
        };
        let body = br#"{"id":"evt_1","type":"charge.succeeded"}"#;
        let h = headers(
            "stripe-signature",
            "t=1700000000,v1=0000,v1=c0475716eb2200f1fe97fcf35a3c05d1fd4f8ba9a07a596730c8d18bb87c0672,v0=abc",
        );
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_100);
        assert!(verify(&auth, &h, body, at).is_ok());
        let late = UNIX_EPOCH + Duration::from_secs(1_700_000_400);
        assert!(verify(&auth, &h, body, late).unwrap_err().contains("stale"));
        assert!(verify(&auth, &h, b"{}", at).is_err());
    }

    #[test]
    fn bearer_and_generic() {
        let auth = Auth::Bearer {
            token: b"s3cret".to_vec(),
        };
        assert!(
            verify(
                &auth,
                &headers("authorization", "Bearer s3cret"),
                b"",
                SystemTime::now()
            )
            .is_ok()
        );
        assert!(
            verify(
                &auth,
                &headers("authorization", "Bearer nope"),
                b"",
                SystemTime::now()
            )
            .is_err()
        );
        let auth = Auth::Hmac {
            secret: b"It's a Secret to Everybody".to_vec(),
            header: "x-signature".into(),
        };
        let h = headers(
            "x-signature",
            "dXEH6g6yUJ/CESIczphLijdXC211hsIsRvQ3nIsEPhc=",
        );
        assert!(verify(&auth, &h, b"Hello, World!", SystemTime::now()).is_ok());
    }
}

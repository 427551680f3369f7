//! The output topic's own settings can delete a changelog: with
//! `cleanup.policy=delete`, a finite `retention.ms` and record timestamps
//! set by the producer (`message.timestamp.type=CreateTime`), the broker
//! deletes records whose timestamp is older than the retention, however
//! recently they were written. A changelog's record timestamp is its
//! window's end, so a backfill of last year's events would be committed and
//! then deleted minutes later. [`RetentionGuard`] reads the topic's config
//! when the sink opens and refuses (or, with `retention_check=warn`, warns
//! once) before it writes a record the broker would delete.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use tracing::warn;
use ubik_connector::time::{now_ms, write_rfc3339_micros};

use crate::error::Error;

/// What to do about a record the topic's retention would delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetentionCheck {
    /// Stop before writing it (the default).
    #[default]
    Refuse,
    /// Write it and log a warning once.
    Warn,
}

/// A topic's time-based deletion of records by their own timestamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletingRetention {
    pub topic: String,
    pub policy: String,
    pub retention_ms: i64,
}

/// The values of `names` in `topic`'s config (`None` where unset).
pub fn topic_config(
    config: &ClientConfig,
    topic: &str,
    names: &[&str],
) -> Result<Vec<Option<String>>, Error> {
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = futures_executor::block_on(
        admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &opts),
    )
    .map_err(|e| Error::Transient(format!("cannot read the config of topic {topic}: {e}")))?;
    let Some(Ok(resource)) = results.into_iter().next() else {
        return Err(Error::Transient(format!(
            "the broker did not return the config of topic {topic}"
        )));
    };
    Ok(names
        .iter()
        .map(|name| resource.get(name).and_then(|e| e.value.clone()))
        .collect())
}

/// The topic's time-based deletion, if its records can be deleted by the
/// timestamps the producer gives them.
pub fn deleting_retention(
    config: &ClientConfig,
    topic: &str,
) -> Result<Option<DeletingRetention>, Error> {
    let [policy, retention_ms, timestamp_type] = <[Option<String>; 3]>::try_from(topic_config(
        config,
        topic,
        &["cleanup.policy", "retention.ms", "message.timestamp.type"],
    )?)
    .map_err(|_| Error::Transient(format!("incomplete config of topic {topic}")))?;
    let policy = policy.unwrap_or_else(|| "delete".into());
    let retention_ms = retention_ms
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(-1);
    let stamped_by_producer = timestamp_type.is_none_or(|t| t == "CreateTime");
    let deletes = policy.split(',').any(|p| p.trim() == "delete");
    Ok(
        (deletes && retention_ms >= 0 && stamped_by_producer).then(|| DeletingRetention {
            topic: topic.to_string(),
            policy,
            retention_ms,
        }),
    )
}

/// Checks each record timestamp against the topic's retention horizon.
#[derive(Debug)]
pub struct RetentionGuard {
    rule: DeletingRetention,
    check: RetentionCheck,
    /// Records stamped before this are deleted by the broker's next sweep.
    horizon_ms: i64,
    warned: bool,
}

impl RetentionGuard {
    pub fn new(rule: DeletingRetention, check: RetentionCheck) -> Self {
        warn!(
            "output topic {} deletes records older than {} by their timestamp (cleanup.policy={}, retention.ms={}): windows of this changelog disappear from it once their end is that old; cleanup.policy=compact keeps the latest value of every key",
            rule.topic,
            human(rule.retention_ms),
            rule.policy,
            rule.retention_ms
        );
        let mut guard = Self {
            horizon_ms: 0,
            rule,
            check,
            warned: false,
        };
        guard.refresh();
        guard
    }

    /// Moves the horizon to now (called once per epoch: per-record clock
    /// reads would cost more than the check).
    pub fn refresh(&mut self) {
        self.horizon_ms = now_ms().saturating_sub(self.rule.retention_ms);
    }

    /// Whether a record stamped `timestamp_ms` may be written.
    pub fn check(&mut self, timestamp_ms: i64) -> Result<(), Error> {
        if timestamp_ms >= self.horizon_ms {
            return Ok(());
        }
        let r = &self.rule;
        let what = format!(
            "output topic {} has cleanup.policy={} with retention.ms={} ({}) and producer timestamps, and this run is about to write a record stamped {} (a changelog record's timestamp is its window's end): the broker would delete it minutes after it is committed",
            r.topic,
            r.policy,
            r.retention_ms,
            human(r.retention_ms),
            rfc3339(timestamp_ms)
        );
        match self.check {
            RetentionCheck::Refuse => Err(Error::Config(format!(
                "{what}. Set cleanup.policy=compact on the topic (kafka-configs.sh --alter --entity-type topics --entity-name {} --add-config cleanup.policy=compact), or retention.ms=-1, or message.timestamp.type=LogAppendTime; or add retention_check=warn to the --to URL to write anyway",
                r.topic
            ))),
            RetentionCheck::Warn => {
                if !self.warned {
                    self.warned = true;
                    warn!("{what}; writing anyway (retention_check=warn)");
                }
                Ok(())
            }
        }
    }
}

fn human(ms: i64) -> String {
    match ms {
        ms if ms % 86_400_000 == 0 => format!("{} days", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{} hours", ms / 3_600_000),
        ms => format!("{} s", ms / 1000),
    }
}

fn rfc3339(ms: i64) -> String {
    let mut out = Vec::new();
    write_rfc3339_micros(&mut out, ms.saturating_mul(1000));
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(check: RetentionCheck) -> RetentionGuard {
        let rule = DeletingRetention {
            topic: "out".into(),
            policy: "delete".into(),
            retention_ms: 7 * 86_400_000,
        };
        RetentionGuard::new(rule, check)
    }

    #[test]
    fn a_record_older_than_the_retention_is_refused_or_warned_about() {
        let last_year = now_ms() - 365 * 86_400_000;
        let err = guard(RetentionCheck::Refuse).check(last_year).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("retention.ms=604800000 (7 days)"), "{msg}");
        assert!(msg.contains("cleanup.policy=compact"), "{msg}");
        assert!(guard(RetentionCheck::Refuse).check(now_ms()).is_ok());
        assert!(guard(RetentionCheck::Warn).check(last_year).is_ok());
    }
}

//! Topic metadata and creation.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;

use crate::config::KafkaUrl;
use crate::error::Error;

pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Partition ids of `topic`, or `None` if it does not exist.
pub fn partitions<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<Option<Vec<i32>>, Error> {
    let md = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| Error::Transient(format!("cannot read metadata of topic {topic}: {e}")))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if let Some(err) = t.error() {
        let code = RDKafkaErrorCode::from(err);
        if matches!(
            code,
            RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic
        ) {
            return Ok(None);
        }
        return Err(Error::Topic(format!("topic {topic}: {code}")));
    }
    let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    ids.sort_unstable();
    Ok((!ids.is_empty()).then_some(ids))
}

/// The end offset of each partition of `url`'s topic.
pub fn end_offsets(
    url: &KafkaUrl,
    properties: &std::collections::BTreeMap<String, String>,
) -> Result<std::collections::BTreeMap<i32, i64>, Error> {
    let consumer: BaseConsumer = url.client_config(properties).create()?;
    let parts = partitions(&consumer, &url.topic)?
        .ok_or_else(|| Error::Topic(format!("topic {} does not exist", url.topic)))?;
    parts
        .into_iter()
        .map(|p| {
            consumer
                .fetch_watermarks(&url.topic, p, METADATA_TIMEOUT)
                .map(|(_, high)| (p, high))
                .map_err(|e| {
                    Error::Transient(format!("cannot read offsets of {}/{p}: {e}", url.topic))
                })
        })
        .collect()
}

/// Makes sure the output topic exists, creating it when allowed, with
/// `default_cleanup` unless the URL names a policy.
pub fn ensure_topic(
    url: &KafkaUrl,
    config: &ClientConfig,
    default_cleanup: &str,
) -> Result<Vec<i32>, Error> {
    let cleanup = url.cleanup.as_deref().unwrap_or(default_cleanup);
    ensure_topic_with(url, config, &[("cleanup.policy", cleanup)], "output topic")
}

/// Makes sure `url`'s topic exists, creating it (unless the URL says
/// `create=false`) with its partitions, replication and `settings`; `what`
/// names the topic in messages ("output topic").
pub fn ensure_topic_with(
    url: &KafkaUrl,
    config: &ClientConfig,
    settings: &[(&str, &str)],
    what: &str,
) -> Result<Vec<i32>, Error> {
    let probe: BaseConsumer = config.create()?;
    if let Some(p) = partitions(&probe, &url.topic)? {
        return Ok(p);
    }
    if !url.create {
        return Err(Error::Topic(format!(
            "{what} {} does not exist on {} (create it, or drop create=false)",
            url.topic, url.bootstrap
        )));
    }
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let topic = settings.iter().fold(
        NewTopic::new(
            &url.topic,
            url.partitions,
            TopicReplication::Fixed(url.replication),
        ),
        |t, (k, v)| t.set(k, v),
    );
    let results = futures_executor::block_on(admin.create_topics(&[topic], &AdminOptions::new()))
        .map_err(|e| Error::Topic(format!("cannot create {what} {}: {e}", url.topic)))?;
    for r in results {
        if let Err((name, code)) = r
            && code != RDKafkaErrorCode::TopicAlreadyExists
        {
            return Err(Error::Topic(format!(
                "{what} {name} does not exist and could not be created: {code} (create it with {} partitions, or give the principal CreateTopics rights)",
                url.partitions
            )));
        }
    }
    // Metadata catches up shortly after creation.
    for _ in 0..50 {
        if let Some(p) = partitions(&probe, &url.topic)? {
            return Ok(p);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Error::Topic(format!(
        "topic {} was created but does not appear in metadata",
        url.topic
    )))
}

/// Makes sure a group's repartition topic exists with `partitions`
/// partitions and keeps records until they are consumed: created with
/// `retention.ms=-1` (the second stage deletes what its checkpoints cover);
/// a pre-created one with a time or size retention, another partition count
/// or compaction is refused.
pub fn ensure_repartition_topic(
    bootstrap: &str,
    topic: &str,
    count: i32,
    properties: &std::collections::BTreeMap<String, String>,
) -> Result<(), Error> {
    let url = KafkaUrl::parse(&format!(
        "kafka://{bootstrap}/{topic}?partitions={count}&cleanup=delete"
    ))?;
    let config = url.client_config(properties);
    let parts = ensure_topic_with(
        &url,
        &config,
        &[
            ("cleanup.policy", "delete"),
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
        ],
        "repartition topic",
    )?;
    if parts.len() != count as usize {
        return Err(Error::Topic(format!(
            "the repartition topic {topic} has {} partitions, the input {count}: delete it (it is internal to the group) or give the group another name",
            parts.len()
        )));
    }
    let values = crate::retention::topic_config(
        &config,
        topic,
        &["cleanup.policy", "retention.ms", "retention.bytes"],
    )?;
    let policy = values[0].clone().unwrap_or_else(|| "delete".into());
    let ms: i64 = values[1]
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1);
    let bytes: i64 = values[2]
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1);
    if policy.contains("compact") || ms >= 0 || bytes >= 0 {
        return Err(Error::Topic(format!(
            "the repartition topic {topic} has cleanup.policy={policy}, retention.ms={ms}, retention.bytes={bytes}: the broker could delete rows before the second stage reads them; set cleanup.policy=delete, retention.ms=-1 and retention.bytes=-1 (ubik deletes what its checkpoints cover)"
        )));
    }
    Ok(())
}

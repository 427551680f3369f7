//! [`Purger`]: deletes the records of a topic that durable checkpoints have
//! passed, for topics only one pipeline reads (a group's repartition topic),
//! so they are cleaned as they are consumed, as Kafka Streams purges its
//! repartition topics after each commit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::debug;

use crate::error::Error;

/// One delete request per this interval at most: deleting is housekeeping,
/// and every request is a round trip the task waits for.
const EVERY: Duration = Duration::from_secs(5);
const TIMEOUT: Duration = Duration::from_secs(10);

pub struct Purger {
    admin: AdminClient<DefaultClientContext>,
    topic: String,
    /// The offset below which each partition was deleted.
    purged: BTreeMap<i32, i64>,
    last: Option<Instant>,
}

impl Purger {
    pub fn new(config: &ClientConfig, topic: &str) -> Result<Self, Error> {
        Ok(Self {
            admin: config.create()?,
            topic: topic.to_string(),
            purged: BTreeMap::new(),
            last: None,
        })
    }

    /// Deletes each partition's records before `next` (offsets a durable
    /// checkpoint has passed: no restore reads them again), at most every
    /// few seconds. Returns the partitions' new starts.
    pub fn release(&mut self, next: &BTreeMap<i32, i64>) -> Result<Vec<(i32, i64)>, Error> {
        if self.last.is_some_and(|t| t.elapsed() < EVERY) {
            return Ok(Vec::new());
        }
        let mut tpl = TopicPartitionList::new();
        for (&p, &o) in next {
            if self.purged.get(&p).is_none_or(|&done| o > done) {
                tpl.add_partition_offset(&self.topic, p, Offset::Offset(o))?;
            }
        }
        if tpl.count() == 0 {
            return Ok(Vec::new());
        }
        self.last = Some(Instant::now());
        let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
        let done = futures_executor::block_on(self.admin.delete_records(&tpl, &opts))?;
        let mut starts = Vec::new();
        for e in done.elements() {
            e.error().map_err(|err| {
                Error::Transient(format!(
                    "deleting consumed records of {}/{}: {err}",
                    self.topic,
                    e.partition()
                ))
            })?;
            if let Offset::Offset(low) = e.offset() {
                self.purged.insert(e.partition(), low);
                starts.push((e.partition(), low));
            }
        }
        debug!(topic = %self.topic, ?starts, "consumed records deleted");
        Ok(starts)
    }
}

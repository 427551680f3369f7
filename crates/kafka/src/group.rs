//! [`GroupMember`]: membership of a consumer group, for sharing a topic's
//! partitions as tasks among processes (the Kafka Streams model).
//!
//! The member subscribes with cooperative-sticky assignment (a rebalance
//! moves only the partitions that change owner) and, with an instance id,
//! static membership (a restart within the session timeout keeps its
//! partitions). It reads no records: its partitions stay paused, and each
//! task reads its own partition with its own [`crate::KafkaSource`], from
//! the position in its checkpoint, not from group offsets.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::TopicPartitionList;
use tracing::{info, warn};

use crate::config::KafkaUrl;
use crate::error::Error;

/// A change of the partitions this member owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    /// (topic, partition) pairs.
    Assigned(Vec<(String, u32)>),
    Revoked(Vec<(String, u32)>),
}

/// Called with the partitions a rebalance takes away, before the member
/// gives them up: the tasks commit and checkpoint there, so their next
/// owner starts from where they stopped (as Kafka Streams commits in
/// `onPartitionsRevoked`).
pub type RevokeHandler = Box<dyn FnMut(&[(String, u32)]) + Send>;

/// Collects rebalance events for the run loop, pauses what it is given and
/// hands revoked partitions to the revoke handler.
#[derive(Default)]
pub struct MemberContext {
    events: Mutex<Vec<Assignment>>,
    on_revoke: Mutex<Option<RevokeHandler>>,
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<(String, u32)> {
    let mut ps: Vec<(String, u32)> = tpl
        .elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition() as u32))
        .collect();
    ps.sort_unstable();
    ps
}

impl ClientContext for MemberContext {
    fn error(&self, error: KafkaError, reason: &str) {
        warn!("librdkafka (group member): {error}: {reason}");
    }
}

impl ConsumerContext for MemberContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance
            && let Ok(mut handler) = self.on_revoke.lock()
            && let Some(handler) = handler.as_mut()
        {
            handler(&partitions_of(tpl));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let event = match rebalance {
            Rebalance::Assign(tpl) => {
                // Tasks read their partitions themselves.
                if let Err(e) = consumer.pause(tpl) {
                    warn!("pausing the group member's partitions: {e}");
                }
                Assignment::Assigned(partitions_of(tpl))
            }
            Rebalance::Revoke(tpl) => Assignment::Revoked(partitions_of(tpl)),
            Rebalance::Error(e) => {
                warn!("rebalance: {e}");
                return;
            }
        };
        if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
    }
}

pub struct GroupMember {
    consumer: BaseConsumer<MemberContext>,
    group: String,
    topic: String,
}

impl GroupMember {
    /// Joins `group` for `url`'s topic and `also` (a repartition topic).
    pub fn join(
        url: &KafkaUrl,
        also: &[String],
        group: &str,
        instance_id: Option<&str>,
        properties: &BTreeMap<String, String>,
    ) -> Result<Self, Error> {
        let mut config = url.client_config_with(
            &[("partition.assignment.strategy", "cooperative-sticky")],
            properties,
        );
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if let Some(id) = instance_id {
            config.set("group.instance.id", id);
        }
        // What `ubik status` shows for the member.
        let client_id =
            instance_id.map_or_else(|| format!("ubik-{}", std::process::id()), String::from);
        config.set("client.id", client_id);
        let consumer: BaseConsumer<MemberContext> =
            config.create_with_context(MemberContext::default())?;
        let mut topics = vec![url.topic.as_str()];
        topics.extend(also.iter().map(String::as_str));
        consumer.subscribe(&topics)?;
        info!(group, topic = %url.topic, instance = ?instance_id, "joining the consumer group");
        Ok(Self {
            consumer,
            group: group.to_string(),
            topic: url.topic.clone(),
        })
    }

    /// Installs the handler of revoked partitions ([`RevokeHandler`]). It
    /// runs inside [`Self::poll`] and [`Self::leave`], on their thread.
    pub fn on_revoke(&self, handler: RevokeHandler) {
        if let Ok(mut h) = self.consumer.context().on_revoke.lock() {
            *h = Some(handler);
        }
    }

    /// The subscribed topic's partitions (one task each).
    pub fn partitions(&self) -> Result<Vec<i32>, Error> {
        crate::admin::partitions(&self.consumer, &self.topic)?
            .ok_or_else(|| Error::Topic(format!("input topic {} does not exist", self.topic)))
    }

    /// Serves the group protocol (heartbeats, rebalances) for up to
    /// `timeout`; returns the assignment changes since the last call.
    pub fn poll(&self, timeout: Duration) -> Vec<Assignment> {
        // Records are not expected (the partitions are paused): dropped.
        if let Some(Err(e)) = self.consumer.poll(timeout) {
            warn!("group {}: {e}", self.group);
        }
        self.consumer
            .context()
            .events
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default()
    }

    /// Leaves the group (a static member only stops heartbeating: its
    /// partitions wait for it until the session times out).
    pub fn leave(self) {
        self.consumer.unsubscribe();
        for _ in 0..10 {
            let _ = self.consumer.poll(Duration::from_millis(50));
        }
        info!(group = %self.group, topic = %self.topic, "left the consumer group");
    }
}

/// One member of a group, as the broker describes it.
#[derive(Debug, Clone)]
pub struct MemberStatus {
    pub id: String,
    pub client_id: String,
    pub host: String,
    /// Its partitions of the subscribed topic.
    pub partitions: Vec<i32>,
}

/// A consumer group's state and members.
#[derive(Debug, Clone)]
pub struct GroupStatus {
    pub state: String,
    pub members: Vec<MemberStatus>,
}

/// Describes `group`: its state and each member's partitions of `url`'s topic.
pub fn describe(
    url: &KafkaUrl,
    group: &str,
    properties: &BTreeMap<String, String>,
) -> Result<GroupStatus, Error> {
    let consumer: BaseConsumer = url.client_config(properties).create()?;
    let list = consumer
        .fetch_group_list(Some(group), crate::admin::METADATA_TIMEOUT)
        .map_err(|e| Error::Transient(format!("cannot describe group {group}: {e}")))?;
    let Some(g) = list.groups().iter().find(|g| g.name() == group) else {
        return Ok(GroupStatus {
            state: "Dead".into(),
            members: Vec::new(),
        });
    };
    let members = g
        .members()
        .iter()
        .map(|m| MemberStatus {
            id: m.id().to_string(),
            client_id: m.client_id().to_string(),
            host: m.client_host().to_string(),
            partitions: m
                .assignment()
                .map(|a| assigned_partitions(a, &url.topic))
                .unwrap_or_default(),
        })
        .collect();
    Ok(GroupStatus {
        state: g.state().to_string(),
        members,
    })
}

/// The partitions of `topic` in a consumer-protocol assignment (version
/// 0-3: int16 version, then [topic: string, partitions: [int32]], then
/// user data). A malformed one yields what was read before the damage.
fn assigned_partitions(bytes: &[u8], topic: &str) -> Vec<i32> {
    let mut at = 2usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = bytes.get(at..at + n)?;
        at += n;
        Some(s)
    };
    let mut out = Vec::new();
    let Some(topics) = take(4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])) else {
        return out;
    };
    for _ in 0..topics.max(0) {
        let Some(len) = take(2).map(|b| i16::from_be_bytes([b[0], b[1]]) as usize) else {
            break;
        };
        let Some(name) = take(len).map(|b| b == topic.as_bytes()) else {
            break;
        };
        let Some(count) = take(4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])) else {
            break;
        };
        for _ in 0..count.max(0) {
            let Some(p) = take(4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])) else {
                break;
            };
            if name {
                out.push(p);
            }
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_names_its_partitions() {
        let mut b = vec![0, 1, 0, 0, 0, 2];
        for (topic, parts) in [("other", vec![9i32]), ("orders", vec![4, 1])] {
            b.extend((topic.len() as i16).to_be_bytes());
            b.extend(topic.as_bytes());
            b.extend((parts.len() as i32).to_be_bytes());
            for p in parts {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend([0, 0, 0, 0]);
        assert_eq!(assigned_partitions(&b, "orders"), vec![1, 4]);
        // Cut inside the last partition: what came before it.
        assert_eq!(assigned_partitions(&b[..b.len() - 6], "orders"), vec![4]);
    }
}

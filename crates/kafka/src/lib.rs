//! # ubik-kafka
//!
//! Kafka as a ubik source and sink, through librdkafka.
//!
//! - [`KafkaSource`]: assigns every partition of a topic explicitly (no
//!   rebalancing: the checkpoint, not the group, owns positions), reads with
//!   `read_committed`, returns records per partition in offset order, and can
//!   run bounded between start and end offsets captured when it starts.
//! - [`KafkaSink`]: writes the changelog keyed by its key bytes (librdkafka's
//!   default partitioner: one home partition per key), with the window end as
//!   record timestamp; `transactional` (one transaction per checkpoint epoch)
//!   or `idempotent` emit. It refuses to write a keyed changelog record
//!   the topic's time-based retention would delete ([`retention`]).
//! - [`KafkaDeadLetters`]: dead letters with the original bytes and headers.
//! - [`GroupMember`] and [`StateTopic`]: scale-out over a consumer group,
//!   each task's checkpoints replicated to a compacted topic.

pub mod admin;
mod batch;
pub mod config;
pub mod dead_letters;
pub mod error;
pub mod group;
pub mod purge;
pub mod retention;
pub mod sink;
pub mod source;
pub mod state;

pub use config::{EmitMode, KafkaUrl};
pub use dead_letters::KafkaDeadLetters;
pub use error::Error;
pub use group::{Assignment, GroupMember, GroupStatus, MemberStatus};
pub use sink::KafkaSink;
pub use source::KafkaSource;
pub use state::StateTopic;

/// The librdkafka binding, for tools and tests that talk to the same brokers.
pub use rdkafka;

//! Raw command-line flags. They are turned into a validated configuration
//! (see `settings`) before anything runs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "ubik",
    version,
    about = "Streaming SQL over Kafka, webhooks and files: windowed and continuous GROUP BY published as an upsert changelog.",
    after_help = "Example:\n  ubik run \"SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')\" --from demo://orders"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log level: error, warn, info, debug, trace (or a tracing filter).
    #[arg(long, global = true, env = "UBIK_LOG", default_value = "info")]
    pub log: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a query over a source and publish its changelog.
    Run(Box<RunArgs>),
    /// Print a query's result schema and changelog key without reading any row.
    Validate(Box<ValidateArgs>),
    /// Show a consumer group's members, their tasks, and each task's last checkpoint.
    Status(StatusArgs),
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The group (as given to `ubik run --group`).
    #[arg(long)]
    pub group: String,
    /// The group's input topic: kafka://host:port/topic (repeatable, in
    /// the pipeline's source order, for a group reading several; a
    /// NAME= prefix is ignored).
    #[arg(long, required = true)]
    pub from: Vec<String>,
    /// librdkafka property (repeatable).
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    pub kafka_property: Vec<String>,
}

#[derive(Args, Debug, Default)]
pub struct QueryArgs {
    /// The SQL query (or use -f). It may start with a `--` comment.
    #[arg(allow_hyphen_values = true)]
    pub sql: Option<String>,
    /// A pipeline file (*.toml) or a file holding the SQL query.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Input schema: a column list ("merchant VARCHAR, ts TIMESTAMP, amount DOUBLE")
    /// or @path to a JSON schema file; NAME=... for the source named NAME
    /// (repeatable). A PRIMARY KEY makes the source a versioned table for
    /// temporal joins. Inferred from the input when omitted.
    #[arg(long)]
    pub schema: Vec<String>,
    /// Watermark delay: rows this far out of order are not late (e.g. 5s).
    #[arg(long)]
    pub lateness: Option<String>,
    /// How long closed windows accept late rows (upserts) before they are dead-lettered.
    #[arg(long)]
    pub retention: Option<String>,
    /// How long a join keeps rows past the watermark so late rows on either side still pair (default 0s: late join rows are dead-lettered).
    #[arg(long)]
    pub join_retention: Option<String>,
    /// Threads for decoding and aggregating large batches (default: one per core; output is the same for any count).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Event-time grid for late updates and continuous-query flushes (e.g. 1s).
    #[arg(long)]
    pub emit_interval: Option<String>,
    /// Refuse events further than this ahead of the wall clock.
    #[arg(long)]
    pub max_future: Option<String>,
    /// Event-time column of continuous and pass-through queries, and of a versioned table with several TIMESTAMP columns.
    #[arg(long)]
    pub event_time: Option<String>,
    /// Record key of an append-only result (a pass-through or a join): output columns, comma-separated.
    #[arg(long)]
    pub key: Option<String>,
    /// Drop a continuous GROUP BY's group once its newest event is this far behind the watermark (e.g. 30d).
    #[arg(long)]
    pub state_ttl: Option<String>,
    /// With --state-ttl: retract each dropped group with a tombstone.
    #[arg(long)]
    pub ttl_tombstones: bool,
}

#[derive(Args, Debug, Default)]
pub struct RunArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// Source: kafka://host:port/topic, webhook://host:port/path, file://path.jsonl, - (stdin), demo://orders.
    /// Repeat as NAME=URL for several sources (one per table the query reads).
    #[arg(long)]
    pub from: Vec<String>,
    /// The source's SQL table name (default: the topic, the webhook path's last segment,
    /// or for files, stdin and demo the table the query reads).
    #[arg(long)]
    pub table: Option<String>,
    /// Destination topic: kafka://host:port/topic (stdout when omitted). ubik writes no files.
    #[arg(long)]
    pub to: Option<String>,
    /// Checkpoint directory: resume from it, and write checkpoints to it.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// State held in memory before cold groups spill to disk, e.g. 2GiB (default: half the machine's memory).
    #[arg(long)]
    pub state_memory: Option<String>,
    /// Directory of spilled and checkpointed state (default: CHECKPOINT/state, or a temporary directory).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Checkpoint at least this often (default 10s).
    #[arg(long)]
    pub checkpoint_interval: Option<String>,
    /// Also checkpoint after this many input records.
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Kafka emit mode: transactional (default) or idempotent.
    #[arg(long)]
    pub emit: Option<String>,
    /// Share the input topic's partitions with every process started with this pipeline and group (Kafka consumer group); needs --checkpoint and --to kafka://.
    #[arg(long)]
    pub group: Option<String>,
    /// Static group membership: a restart with the same id keeps this process's tasks.
    #[arg(long, requires = "group")]
    pub instance_id: Option<String>,
    /// With --group: the columns the input topic is partitioned by (records with equal values share a partition).
    #[arg(long, requires = "group", value_delimiter = ',')]
    pub partitioned_by: Vec<String>,
    /// Undecodable input: fail (default), skip, or dlq.
    #[arg(long)]
    pub on_error: Option<String>,
    /// Dead-letter destination: kafka://host:port/topic or stderr (default).
    #[arg(long)]
    pub dlq: Option<String>,
    /// Advance the watermark of a silent input with the wall clock after this long (0 = never).
    #[arg(long)]
    pub idle_timeout: Option<String>,
    /// Records per engine batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// librdkafka property for sources and sinks (repeatable), e.g. -X security.protocol=SASL_SSL.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    pub kafka_property: Vec<String>,
    /// A librdkafka properties file (key=value lines).
    #[arg(long)]
    pub kafka_config: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9100).
    #[arg(long)]
    pub metrics: Option<String>,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// The source the query will read (names its table; may provide the schema); repeatable as NAME=URL.
    #[arg(long)]
    pub from: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

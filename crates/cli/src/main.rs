//! The `ubik` command.

mod args;
mod metrics;
mod pipeline_file;
mod progress;
mod settings;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::Parser;
use ubik_engine::EngineError;
use ubik_engine::connector::{ConnectorError, DeadLetterSink, Sink};
use ubik_kafka::{KafkaDeadLetters, KafkaSink};
use ubik_runtime::dead_letter::StderrDeadLetters;
use ubik_runtime::runner::{RunEnd, RunOptions, run_to_sink};
use ubik_runtime::{Pipeline, RuntimeError, SourceSpec, parse_source, plan_for};

use args::{Cli, Command, ValidateArgs};
use settings::{RunSettings, SinkSettings};

/// Exit code for a query or configuration the user must fix.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    let result = match cli.command {
        Command::Run(args) => settings::run_settings(*args).and_then(run),
        Command::Validate(args) => validate(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

/// 2 for anything the user must fix in the query or configuration, 1 otherwise.
fn exit_code(e: &anyhow::Error) -> u8 {
    let engine = |e: &EngineError| {
        matches!(
            e,
            EngineError::Sql { .. } | EngineError::Unsupported { .. } | EngineError::Schema(_)
        )
    };
    for cause in e.chain() {
        if let Some(r) = cause.downcast_ref::<RuntimeError>() {
            return match r {
                RuntimeError::Config(_) | RuntimeError::Format(_) => EXIT_USAGE,
                RuntimeError::Engine(e) if engine(e) => EXIT_USAGE,
                _ => 1,
            };
        }
        if let Some(e) = cause.downcast_ref::<EngineError>() {
            return if engine(e) { EXIT_USAGE } else { 1 };
        }
        if cause.downcast_ref::<ubik_format::FormatError>().is_some() {
            return EXIT_USAGE;
        }
    }
    1
}

fn open_sink(
    sink: &SinkSettings,
    properties: &std::collections::BTreeMap<String, String>,
    pipeline: &Pipeline,
) -> Result<Box<dyn Sink>> {
    Ok(match sink {
        SinkSettings::Stdout => Box::new(ubik_connectors::StdoutSink::default()),
        SinkSettings::Kafka { url, emit } => {
            // Stable across restarts of the same pipeline, so a restarted (or
            // second) instance fences the previous one.
            let transactional_id = format!("ubik-{}", pipeline.fingerprint());
            Box::new(
                KafkaSink::open(
                    url,
                    properties,
                    *emit,
                    Some(&transactional_id),
                    matches!(
                        pipeline.plan().kind,
                        ubik_engine::plan::QueryKind::Aggregate(_)
                    ),
                )
                .map_err(ConnectorError::from)?,
            )
        }
    })
}

fn run(settings: RunSettings) -> Result<()> {
    let RunSettings {
        config,
        sink: sink_settings,
        dlq,
        kafka_properties,
        metrics: metrics_addr,
        quiet,
    } = settings;
    let total_bytes = match &config.source {
        SourceSpec::File(p) => std::fs::metadata(p).ok().map(|m| m.len()),
        _ => None,
    };
    let checkpoint = config.checkpoint.clone();
    let dead_letters: Box<dyn DeadLetterSink> = match &dlq {
        Some(url) => {
            Box::new(KafkaDeadLetters::open(url, &kafka_properties).map_err(ConnectorError::from)?)
        }
        None => Box::new(StderrDeadLetters),
    };
    let metrics = metrics::Metrics::default();
    if let Some(addr) = &metrics_addr {
        metrics.serve(addr)?;
    }
    let mut pipeline = Pipeline::open_with(config, dead_letters)?;
    let mut sink = open_sink(&sink_settings, &kafka_properties, &pipeline)?;
    if matches!(sink_settings, SinkSettings::Kafka { .. }) && checkpoint.is_none() {
        tracing::warn!("no --checkpoint: a restart reprocesses the input from its start offsets");
    }
    tracing::info!(
        source = pipeline.source_name(),
        sink = sink.describe(),
        kind = pipeline.plan().kind_name(),
        key = ?pipeline.plan().key_names(),
        "running"
    );

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // A second signal exits at once.
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))?;
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let mut progress = progress::Progress::new(quiet, total_bytes);
    let mut report = |s: &ubik_runtime::Stats| {
        metrics.update(s);
        progress.report(s);
    };
    let end = run_to_sink(
        &mut pipeline,
        sink.as_mut(),
        RunOptions {
            commit_interval: checkpoint
                .as_ref()
                .map_or(Duration::from_secs(1), |c| c.interval),
            commit_records: checkpoint.as_ref().and_then(|c| c.every_records),
            stop: &stop,
            report: &mut report,
            report_every: Duration::from_secs(
                if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                    1
                } else {
                    5
                },
            ),
        },
    )?;
    sink.close()?;
    progress::Progress::new(quiet, None).finish(&pipeline.stats);
    if end == RunEnd::Stopped {
        tracing::info!("drained: output committed and checkpointed");
    }
    Ok(())
}

fn validate(args: ValidateArgs) -> Result<()> {
    let file = settings::load_file(&args.query)?;
    let sql = settings::resolve_sql(&args.query, &file)?;
    let options = settings::query_options(&args.query, &file)?;
    let declared =
        settings::resolve_schema(args.query.schema.as_deref().or(file.schema.as_deref()))?;
    let tables = ubik_engine::sql::referenced_tables(&sql);
    let from = args.from.clone().or(file.from.clone());
    // The schema: declared, or the source's own / inferred from a sample.
    let (table, schema) = match (declared, from) {
        (Some(schema), from) => {
            let table = match (&from, tables.as_slice()) {
                (Some(url), _) if url.starts_with("kafka://") || url.starts_with("webhook://") => {
                    url.rsplit('/')
                        .next()
                        .unwrap_or_default()
                        .split('?')
                        .next()
                        .unwrap_or_default()
                        .to_string()
                }
                (_, [one]) => one.clone(),
                _ => tables.first().cloned().unwrap_or_else(|| "input".into()),
            };
            (table, schema)
        }
        (None, Some(url)) => {
            let mut config = ubik_runtime::PipelineConfig::new(sql.clone(), parse_source(&url)?);
            config.options = options.clone();
            let pipeline = Pipeline::open(config)?;
            let table = pipeline.plan().source.name.clone();
            (table, Arc::clone(pipeline.schema()))
        }
        (None, None) => {
            return Err(anyhow!(
                "validate needs the input schema: --schema \"col TYPE, ...\" (or @schema.json), or --from URL to read it from the source"
            ));
        }
    };
    let plan = plan_for(&sql, &table, schema, options)?;
    if args.json {
        let fields: Vec<serde_json::Value> = plan
            .output_schema
            .fields()
            .iter()
            .map(|f| serde_json::json!({"name": f.name(), "type": f.data_type().to_string(), "nullable": f.is_nullable()}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"source": plan.source.name, "kind": plan.kind_name(), "schema": fields, "key": plan.key_names()})
        );
    } else {
        println!("{plan}");
    }
    Ok(())
}

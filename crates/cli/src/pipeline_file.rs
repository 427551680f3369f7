//! The pipeline file (`ubik run -f pipeline.toml`): everything the flags
//! say, in TOML. Unknown keys and wrong types are errors with the line.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, anyhow};
use serde::Deserialize;

/// Where a query's text is in a file: errors point at the file's lines.
#[derive(Debug, Clone, Default)]
pub struct QueryOrigin {
    pub file: String,
    /// Lines of the file before the query's first line.
    pub lines: u64,
    /// The file's text before the query on its first line.
    pub prefix: String,
}

impl QueryOrigin {
    /// The whole file is the query.
    pub fn whole(path: &Path) -> Self {
        Self {
            file: path.display().to_string(),
            ..Self::default()
        }
    }

    /// `query = ...` in the TOML text `text`: where its string starts (a
    /// multi-line string's first line break is not part of it).
    fn in_toml(path: &Path, text: &str) -> Option<Self> {
        let (index, line) = text.lines().enumerate().find(|(_, l)| {
            l.trim_start()
                .strip_prefix("query")
                .is_some_and(|r| r.trim_start().starts_with('='))
        })?;
        let value = line.split_once('=')?.1;
        let quote_at = line.len() - value.trim_start().len();
        let value = value.trim_start();
        let multi = value.starts_with("\"\"\"") || value.starts_with("'''");
        let (lines, prefix) = if multi && value.len() == 3 {
            (index as u64 + 1, String::new())
        } else {
            let skip = if multi { 3 } else { 1 };
            (index as u64, line[..quote_at + skip].to_string())
        };
        Some(Self {
            file: path.display().to_string(),
            lines,
            prefix,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    /// Where the query is written (not a key of the file).
    #[serde(skip)]
    pub query_origin: Option<QueryOrigin>,
    pub query: Option<String>,
    pub query_file: Option<String>,
    pub from: Option<String>,
    pub table: Option<String>,
    pub to: Option<String>,
    pub schema: Option<String>,
    pub schema_file: Option<String>,
    pub checkpoint: Option<String>,
    pub checkpoint_interval: Option<String>,
    pub checkpoint_every: Option<u64>,
    pub emit: Option<String>,
    pub group: Option<String>,
    pub instance_id: Option<String>,
    pub partitioned_by: Option<Vec<String>>,
    pub on_error: Option<String>,
    pub dlq: Option<String>,
    pub lateness: Option<String>,
    pub retention: Option<String>,
    pub join_retention: Option<String>,
    pub emit_interval: Option<String>,
    pub idle_timeout: Option<String>,
    pub max_future: Option<String>,
    pub event_time: Option<String>,
    pub key: Option<String>,
    pub state_ttl: Option<String>,
    pub ttl_tombstones: Option<bool>,
    pub state_memory: Option<String>,
    pub state_dir: Option<String>,
    pub batch_size: Option<usize>,
    pub threads: Option<usize>,
    pub metrics: Option<String>,
    /// librdkafka properties.
    #[serde(default)]
    pub kafka: BTreeMap<String, String>,
    /// Named sources (`[sources.NAME]`), one per SQL table, beside or
    /// instead of `from`.
    #[serde(default)]
    pub sources: BTreeMap<String, NamedSource>,
}

/// `[sources.NAME]`: a source whose SQL table is `NAME`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedSource {
    pub from: String,
    pub schema: Option<String>,
    pub schema_file: Option<String>,
}

impl PipelineFile {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read pipeline file {}", path.display()))?;
        let mut file: PipelineFile = toml::from_str(&text)
            .map_err(|e| anyhow!("{}: {}", path.display(), e.to_string().trim_end()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        if file.query.is_some() {
            file.query_origin = QueryOrigin::in_toml(path, &text);
        }
        if let Some(q) = &file.query_file {
            if file.query.is_some() {
                return Err(anyhow!(
                    "{}: give either query or query_file, not both",
                    path.display()
                ));
            }
            let p = base.join(q);
            file.query_origin = Some(QueryOrigin::whole(&p));
            file.query = Some(
                std::fs::read_to_string(&p)
                    .with_context(|| format!("cannot read query_file {}", p.display()))?,
            );
        }
        if let Some(s) = &file.schema_file {
            if file.schema.is_some() {
                return Err(anyhow!(
                    "{}: give either schema or schema_file, not both",
                    path.display()
                ));
            }
            file.schema = Some(format!("@{}", base.join(s).display()));
        }
        for (name, source) in &mut file.sources {
            if let Some(s) = &source.schema_file {
                if source.schema.is_some() {
                    return Err(anyhow!(
                        "{}: [sources.{name}]: give either schema or schema_file, not both",
                        path.display()
                    ));
                }
                source.schema = Some(format!("@{}", base.join(s).display()));
            }
        }
        Ok(file)
    }
}

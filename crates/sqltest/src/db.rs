//! [`StreamDb`]: the sqllogictest database over ubik's engine.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{Field, Schema, SchemaRef};
use sqllogictest::{DBOutput, DefaultColumnType};
use sqlparser::ast::{Expr, SetExpr, Statement, UnaryOperator, Value};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use ubik_engine::QueryPlan;
use ubik_engine::progress::partition_id;
use ubik_format::json::JsonDecoder;
use ubik_format::schema::sql_type;
use ubik_runtime::Settings;

use crate::Error;
use crate::harness::{Feed, Record, Spill, run_full};

struct Table {
    schema: SchemaRef,
    /// Rows as JSON objects, in arrival order.
    rows: Vec<String>,
    /// The source partition of each row (`INSERT INTO t PARTITION (n)`; 0 by default).
    partitions: Vec<u32>,
    /// Whether each row is a deletion (`DELETE FROM t WHERE key = .. AND ts = ..`).
    deletions: Vec<bool>,
}

#[derive(Default)]
pub struct StreamDb {
    tables: BTreeMap<String, Table>,
    /// Every inserted row in arrival order, as (table, row index in it).
    arrivals: Vec<(String, usize)>,
    settings: Settings,
    /// `SET dead_letters = 'show'`: list rejected rows after the changelog.
    show_dead_letters: bool,
}

impl StreamDb {
    pub fn new() -> Self {
        Self::default()
    }

    fn create(&mut self, stmt: &Statement) -> Result<(), Error> {
        let Statement::CreateTable(t) = stmt else {
            unreachable!()
        };
        // `WITH (changelog = 'debezium')`: a changelog keyed by its PRIMARY
        // KEY, declared as a source's schema would be.
        if t.table_options.to_string().contains("changelog") {
            let mut columns: Vec<String> = t.columns.iter().map(|c| c.to_string()).collect();
            columns.extend(t.constraints.iter().map(|c| c.to_string()));
            let schema = ubik_format::schema::parse_column_list(&columns.join(", "))?;
            self.tables.insert(
                t.name.to_string().to_lowercase(),
                Table {
                    schema: ubik_connector::changelog_schema(&schema, "debezium"),
                    rows: Vec::new(),
                    partitions: Vec::new(),
                    deletions: Vec::new(),
                },
            );
            return Ok(());
        }
        let fields = t
            .columns
            .iter()
            .map(|c| {
                Ok(Field::new(
                    c.name.value.clone(),
                    sql_type(&c.data_type)?,
                    true,
                ))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        self.tables.insert(
            t.name.to_string().to_lowercase(),
            Table {
                schema: Arc::new(Schema::new(fields)),
                rows: Vec::new(),
                partitions: Vec::new(),
                deletions: Vec::new(),
            },
        );
        Ok(())
    }

    fn insert(&mut self, stmt: &Statement) -> Result<u64, Error> {
        let Statement::Insert(ins) = stmt else {
            unreachable!()
        };
        let name = ins.table.to_string().to_lowercase();
        let table = self
            .tables
            .get_mut(&name)
            .ok_or_else(|| Error::Other(format!("no table {name}")))?;
        let columns: Vec<String> = if ins.columns.is_empty() {
            table
                .schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect()
        } else {
            ins.columns.iter().map(|c| c.to_string()).collect()
        };
        let partition = match ins.partitioned.as_deref() {
            None => 0,
            Some([e]) => {
                let p = literal(e)?;
                match p.as_u64().and_then(|p| u32::try_from(p).ok()) {
                    Some(p) => p,
                    None => return Err(Error::Other(format!("bad partition {p}"))),
                }
            }
            Some(_) => return Err(Error::Other("PARTITION takes one number".into())),
        };
        let Some(source) = &ins.source else {
            return Err(Error::Other("INSERT needs VALUES".into()));
        };
        let SetExpr::Values(values) = source.body.as_ref() else {
            return Err(Error::Other("INSERT supports VALUES only".into()));
        };
        for row in &values.rows {
            let mut obj = serde_json::Map::new();
            for (c, e) in columns.iter().zip(row.iter()) {
                obj.insert(c.clone(), literal(e)?);
            }
            self.arrivals.push((name.clone(), table.rows.len()));
            table.rows.push(serde_json::Value::Object(obj).to_string());
            table.partitions.push(partition);
            table.deletions.push(false);
        }
        Ok(values.rows.len() as u64)
    }

    /// `DELETE FROM t WHERE col = literal AND ...`: a deletion arriving on
    /// partition 0 of `t`, as a Kafka tombstone would, holding the key and
    /// the event time it takes effect at (the columns the WHERE names).
    /// `None` for another shape of DELETE: that one is a query (and the
    /// engine's to refuse).
    fn delete(&mut self, stmt: &Statement) -> Result<Option<u64>, Error> {
        let Statement::Delete(del) = stmt else {
            unreachable!()
        };
        let from = match &del.from {
            sqlparser::ast::FromTable::WithFromKeyword(t)
            | sqlparser::ast::FromTable::WithoutKeyword(t) => t,
        };
        let name = match from.as_slice() {
            [t] => t.relation.to_string().to_lowercase(),
            _ => return Err(Error::Other("DELETE FROM takes one table".into())),
        };
        let table = self
            .tables
            .get_mut(&name)
            .ok_or_else(|| Error::Other(format!("no table {name}")))?;
        let mut obj = serde_json::Map::new();
        let mut pending: Vec<&Expr> = del.selection.iter().collect();
        while let Some(e) = pending.pop() {
            match e {
                Expr::BinaryOp { left, op, right }
                    if *op == sqlparser::ast::BinaryOperator::And =>
                {
                    pending.push(left);
                    pending.push(right);
                }
                Expr::BinaryOp { left, op, right } if *op == sqlparser::ast::BinaryOperator::Eq => {
                    let Expr::Identifier(col) = left.as_ref() else {
                        return Ok(None);
                    };
                    obj.insert(col.value.clone(), literal(right)?);
                }
                _ => return Ok(None),
            }
        }
        if obj.is_empty() {
            return Ok(None);
        }
        self.arrivals.push((name.clone(), table.rows.len()));
        table.rows.push(serde_json::Value::Object(obj).to_string());
        table.partitions.push(0);
        table.deletions.push(true);
        Ok(Some(1))
    }

    /// `SET name = value`: the runtime's options layer, as the CLI and Python use it.
    fn set(&mut self, sql: &str) -> Result<(), Error> {
        let body = sql.trim().trim_end_matches(';')[3..].trim();
        let (name, value) = body
            .split_once('=')
            .ok_or_else(|| Error::Other(format!("SET needs name = value: {sql}")))?;
        let value = value.trim().trim_matches('\'');
        // The harness's own display switch; everything else is a pipeline setting.
        if name.trim() == "dead_letters" {
            self.show_dead_letters = match value {
                "show" => true,
                "hide" => false,
                _ => return Err(Error::Other("dead_letters is 'show' or 'hide'".into())),
            };
            return Ok(());
        }
        self.settings
            .set(name.trim(), value)
            .map_err(|e| Error::Other(e.to_string()))
    }

    fn query(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, Error> {
        let tables: Vec<(String, SchemaRef)> = self
            .tables
            .iter()
            .map(|(name, t)| (name.clone(), Arc::clone(&t.schema)))
            .collect();
        let plan = ubik_runtime::connect::plan(sql, &tables, self.settings.query.clone())?;
        let mut batches = Vec::with_capacity(plan.sources.len());
        for source in &plan.sources {
            let table = &self.tables[&source.name];
            let mut decoder = JsonDecoder::new(Arc::clone(&table.schema))?;
            // As a pipeline decodes: the columns the query does not read are null.
            decoder.read_only(&source.reads)?;
            let records: Vec<&[u8]> = table.rows.iter().map(|r| r.as_bytes()).collect();
            let decoded = decoder.decode(&records)?;
            if !decoded.bad.is_empty() {
                return Err(Error::Other(format!("bad rows: {:?}", decoded.bad)));
            }
            batches.push(decoded.batch);
        }
        // The rows of the query's sources in arrival order: (partition id, source, row).
        let arrivals: Vec<Arrival> = self
            .arrivals
            .iter()
            .filter_map(|(name, row)| {
                let source = plan.source_index(name)?;
                let table = &self.tables[name];
                Some(Arrival {
                    id: partition_id(source, table.partitions[*row]),
                    source,
                    row: *row,
                    deletion: table.deletions[*row],
                })
            })
            .collect();
        let layouts = layouts(&batches, &arrivals)?;
        let (reference, reference_rejects) = layouts[0].run(&plan, None, None)?;
        // The same input, batched differently, with partitions interleaved
        // differently, resumed from a checkpoint in the middle, and with its
        // state spilled to a store after every batch, must give the same
        // bytes and reject the same rows.
        for layout in &layouts[1..] {
            let len = layout.feeds.len();
            let mut runs = vec![
                (None, None),
                (Some(len / 3), None),
                (Some(2 * len / 3), Some(Spill::TINY)),
            ];
            runs.dedup_by_key(|r| (r.0, r.1.is_some()));
            for (restore, spill) in runs.into_iter().filter(|r| r.0.is_none_or(|r| r < len)) {
                let (got, rejects) = layout.run(&plan, restore, spill)?;
                let what = format!(
                    "{}, restore after feed {restore:?}{}",
                    layout.name,
                    if spill.is_some() {
                        ", state spilled to a store after every batch"
                    } else {
                        ""
                    }
                );
                check_same(&reference, &got, &what)?;
                if rejects != reference_rejects {
                    return Err(Error::Other(format!(
                        "dead letters differ with {what}: {reference_rejects:?} vs {rejects:?}"
                    )));
                }
            }
        }
        let mut rows: Vec<Vec<String>> = reference
            .iter()
            .map(|r| row_of(&plan, r))
            .collect::<Result<_, _>>()?;
        if self.show_dead_letters {
            let several = plan.sources.len() > 1;
            rows.extend(reference_rejects.iter().map(|(source, row, code)| {
                let at = if several {
                    format!("{}#{row}", plan.sources[*source].name)
                } else {
                    row.to_string()
                };
                vec!["!".into(), code.to_string(), at]
            }));
        }
        Ok(DBOutput::Rows {
            types: vec![DefaultColumnType::Any; plan.output_schema.fields().len() + 1],
            rows,
        })
    }
}

/// A rejected row: its source, its index in that source's table, and the reason code.
type DeadLetter = (usize, usize, &'static str);

/// A changelog and its dead letters.
type Outcome = (Vec<Record>, Vec<DeadLetter>);

/// One inserted row of a source the query reads.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    /// Its partition id (source and partition).
    id: u32,
    source: usize,
    /// Its index in its source's table.
    row: usize,
    deletion: bool,
}

/// One way of feeding the rows to a query: feeds in order, and for each
/// feed its rows as (source, row index in that source's table).
struct Layout {
    name: String,
    feeds: Vec<Feed>,
    origins: Vec<Vec<(usize, usize)>>,
}

impl Layout {
    fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            feeds: Vec::new(),
            origins: Vec::new(),
        }
    }

    /// Appends `rows` (all of one partition id) as feeds of `size` rows;
    /// deletions and rows share a feed only when `mixed`.
    fn push(
        &mut self,
        batches: &[RecordBatch],
        rows: &[Arrival],
        size: usize,
        mixed: bool,
    ) -> Result<(), Error> {
        let runs = rows.chunk_by(|a, b| mixed || a.deletion == b.deletion);
        for part in runs.flat_map(|run| run.chunks(size.max(1))) {
            let source = part[0].source;
            let idx = UInt32Array::from_iter_values(part.iter().map(|a| a.row as u32));
            let deleted: Vec<bool> = part.iter().map(|a| a.deletion).collect();
            self.feeds.push(Feed {
                partition: part[0].id,
                batch: take_record_batch(&batches[source], &idx)?,
                deleted: match deleted.contains(&true) {
                    true => deleted,
                    false => Vec::new(),
                },
            });
            self.origins
                .push(part.iter().map(|a| (a.source, a.row)).collect());
        }
        Ok(())
    }

    /// The changelog, and the rejected rows in row order.
    fn run(
        &self,
        plan: &QueryPlan,
        restore: Option<usize>,
        spill: Option<Spill>,
    ) -> Result<Outcome, Error> {
        let out = run_full(plan, &self.feeds, restore, None, spill)?;
        let mut rejects: Vec<DeadLetter> = out
            .rejects
            .iter()
            .map(|(feed, r)| {
                let (source, row) = self.origins[*feed][r.row];
                (source, row, r.reason.code())
            })
            .collect();
        rejects.sort_unstable();
        Ok((out.records, rejects))
    }
}

/// The layouts a query runs with. The first (the reference) feeds each run
/// of consecutive rows of one partition and kind (upserts, deletions) as
/// one batch, in arrival order; the others batch the same runs in 1, 2, 3
/// and 7 rows, upserts and deletions together (as a chunk of a change
/// stream comes); with several partitions (of one source or several),
/// also each partition's rows in turn (ascending, then descending) and
/// round-robin one row at a time.
fn layouts(batches: &[RecordBatch], arrivals: &[Arrival]) -> Result<Vec<Layout>, Error> {
    let runs: Vec<&[Arrival]> = arrivals.chunk_by(|a, b| a.id == b.id).collect();
    let sliced = |name: String, size: Option<usize>| -> Result<Layout, Error> {
        let mut layout = Layout::new(name);
        for run in &runs {
            layout.push(batches, run, size.unwrap_or(run.len()), size.is_some())?;
        }
        Ok(layout)
    };
    let mut out = vec![sliced("the reference batching".into(), None)?];
    for size in [1, 2, 3, 7] {
        out.push(sliced(format!("batch size {size}"), Some(size))?);
    }
    let mut ids: Vec<u32> = arrivals.iter().map(|a| a.id).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > 1 {
        let of =
            |id: u32| -> Vec<Arrival> { arrivals.iter().filter(|a| a.id == id).copied().collect() };
        let mut asc = Layout::new("partitions in turn, ascending");
        for &id in &ids {
            asc.push(batches, &of(id), 2, true)?;
        }
        out.push(asc);
        let mut desc = Layout::new("partitions in turn, descending");
        for &id in ids.iter().rev() {
            desc.push(batches, &of(id), 3, true)?;
        }
        out.push(desc);
        let mut queues: Vec<std::collections::VecDeque<Arrival>> =
            ids.iter().map(|&id| of(id).into()).collect();
        let mut round_robin = Layout::new("partitions round-robin");
        while queues.iter().any(|q| !q.is_empty()) {
            for q in queues.iter_mut() {
                if let Some(a) = q.pop_front() {
                    round_robin.push(batches, &[a], 1, true)?;
                }
            }
        }
        out.push(round_robin);
    }
    Ok(out)
}

fn check_same(a: &[Record], b: &[Record], what: &str) -> Result<(), Error> {
    if a == b {
        return Ok(());
    }
    let first = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    Err(Error::Other(format!(
        "changelog differs with {what} at record {first} ({} vs {} records):\n  reference: {}\n  got:       {}",
        a.len(),
        b.len(),
        a.get(first).map_or("<none>".into(), |r| r.to_string()),
        b.get(first).map_or("<none>".into(), |r| r.to_string())
    )))
}

fn literal(e: &Expr) -> Result<serde_json::Value, Error> {
    Ok(match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => {
                serde_json::from_str(n).map_err(|e| Error::Other(e.to_string()))?
            }
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => {
                serde_json::Value::String(s.clone())
            }
            Value::Boolean(b) => serde_json::Value::Bool(*b),
            Value::Null => serde_json::Value::Null,
            other => return Err(Error::Other(format!("unsupported literal {other}"))),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match literal(expr)? {
            serde_json::Value::Number(n) => {
                serde_json::from_str(&format!("-{n}")).map_err(|e| Error::Other(e.to_string()))?
            }
            other => return Err(Error::Other(format!("cannot negate {other}"))),
        },
        other => return Err(Error::Other(format!("unsupported value {other}"))),
    })
}

/// The members of a JSON object as (name, raw value text), in order, so a
/// number is shown exactly as written on the wire (a DECIMAL keeps its
/// scale's digits, which a round trip through `f64` would drop).
fn members(json: &str) -> Result<Vec<(String, &str)>, Error> {
    let bad = || Error::Other(format!("not a JSON object: {json}"));
    // The end (exclusive) of the value starting at byte `i`.
    let value_end = |mut i: usize| -> Result<usize, Error> {
        let b = json.as_bytes();
        let (mut depth, mut in_string) = (0usize, false);
        while i < b.len() {
            match (in_string, b[i]) {
                (true, b'\\') => i += 1,
                (true, b'"') => in_string = false,
                (true, _) => {}
                (false, b'"') => in_string = true,
                (false, b'[' | b'{') => depth += 1,
                (false, b']' | b'}') if depth > 0 => depth -= 1,
                (false, b',' | b'}') if depth == 0 => return Ok(i),
                _ => {}
            }
            i += 1;
        }
        Err(bad())
    };
    let mut out = Vec::new();
    let mut i = json.find('{').ok_or_else(bad)? + 1;
    while json[i..].starts_with('"') {
        let colon = i + json[i..].find("\":").ok_or_else(bad)? + 1;
        let name: String =
            serde_json::from_str(&json[i..colon]).map_err(|e| Error::Other(e.to_string()))?;
        let end = value_end(colon + 1)?;
        out.push((name, &json[colon + 1..end]));
        i = end + 1;
    }
    Ok(out)
}

fn cell(members: &[(String, &str)], name: &str) -> Result<String, Error> {
    let Some((_, raw)) = members.iter().find(|(n, _)| n == name) else {
        return Ok("NULL".into());
    };
    if raw.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return Ok(raw.to_string());
    }
    let v: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| Error::Other(e.to_string()))?;
    Ok(match v {
        serde_json::Value::Null => "NULL".into(),
        serde_json::Value::String(s) if s.is_empty() => "(empty)".into(),
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    })
}

fn row_of(plan: &QueryPlan, r: &Record) -> Result<Vec<String>, Error> {
    let mut row = Vec::new();
    match &r.value {
        Some(v) => {
            let v = members(v)?;
            row.push("+".into());
            for f in plan.output_schema.fields() {
                row.push(cell(&v, f.name())?);
            }
        }
        None => {
            let k = members(r.key.as_deref().unwrap_or("{}"))?;
            row.push("-".into());
            for (i, f) in plan.output_schema.fields().iter().enumerate() {
                row.push(if plan.key_columns.contains(&i) {
                    cell(&k, f.name())?
                } else {
                    "-".into()
                });
            }
        }
    }
    Ok(row)
}

impl sqllogictest::DB for StreamDb {
    type Error = Error;
    type ColumnType = DefaultColumnType;

    fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, Error> {
        let trimmed = sql.trim_start().to_lowercase();
        if trimmed.starts_with("set ") {
            self.set(sql)?;
            return Ok(DBOutput::StatementComplete(0));
        }
        if ["create table", "insert", "delete"]
            .iter()
            .any(|s| trimmed.starts_with(s))
        {
            let stmts = Parser::parse_sql(&GenericDialect {}, sql)
                .map_err(|e| Error::Other(e.to_string()))?;
            let stmt = &stmts[0];
            return match stmt {
                Statement::CreateTable(_) => {
                    self.create(stmt).map(|_| DBOutput::StatementComplete(0))
                }
                Statement::Delete(_) => match self.delete(stmt)? {
                    Some(n) => Ok(DBOutput::StatementComplete(n)),
                    None => self.query(sql),
                },
                _ => self.insert(stmt).map(DBOutput::StatementComplete),
            };
        }
        self.query(sql)
    }

    fn engine_name(&self) -> &str {
        "ubik"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_keep_raw_values() {
        let json = r#"{"a":"x,}\"y","b":[1,{"c":"]"}],"d":12.50,"e":null,"f":-1e-7}"#;
        let m = members(json).unwrap();
        let names: Vec<&str> = m.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "d", "e", "f"]);
        assert_eq!(cell(&m, "a").unwrap(), "x,}\"y");
        assert_eq!(cell(&m, "b").unwrap(), r#"[1,{"c":"]"}]"#);
        assert_eq!(cell(&m, "d").unwrap(), "12.50");
        assert_eq!(cell(&m, "e").unwrap(), "NULL");
        assert_eq!(cell(&m, "f").unwrap(), "-1e-7");
        assert!(members("{}").unwrap().is_empty());
    }
}

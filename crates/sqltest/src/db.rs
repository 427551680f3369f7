//! [`StreamDb`]: the sqllogictest database over ubik's engine.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef};
use sqllogictest::{DBOutput, DefaultColumnType};
use sqlparser::ast::{Expr, SetExpr, Statement, UnaryOperator, Value};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use ubik_engine::QueryPlan;
use ubik_format::json::JsonDecoder;
use ubik_format::schema::sql_type;
use ubik_runtime::Settings;

use crate::Error;
use crate::harness::{Feed, Record, chunks, run};

struct Table {
    schema: SchemaRef,
    /// Rows as JSON objects, in arrival order.
    rows: Vec<String>,
}

#[derive(Default)]
pub struct StreamDb {
    tables: BTreeMap<String, Table>,
    settings: Settings,
}

impl StreamDb {
    pub fn new() -> Self {
        Self::default()
    }

    fn create(&mut self, stmt: &Statement) -> Result<(), Error> {
        let Statement::CreateTable(t) = stmt else {
            unreachable!()
        };
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
            table.rows.push(serde_json::Value::Object(obj).to_string());
        }
        Ok(values.rows.len() as u64)
    }

    /// `SET name = value`: the runtime's options layer, as the CLI and Python use it.
    fn set(&mut self, sql: &str) -> Result<(), Error> {
        let body = sql.trim().trim_end_matches(';')[3..].trim();
        let (name, value) = body
            .split_once('=')
            .ok_or_else(|| Error::Other(format!("SET needs name = value: {sql}")))?;
        let value = value.trim().trim_matches('\'');
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
        let table = &self.tables[&plan.source.name];
        let mut decoder = JsonDecoder::new(Arc::clone(&table.schema))?;
        let records: Vec<&[u8]> = table.rows.iter().map(|r| r.as_bytes()).collect();
        let decoded = decoder.decode(&records)?;
        if !decoded.bad.is_empty() {
            return Err(Error::Other(format!("bad rows: {:?}", decoded.bad)));
        }
        let batch = decoded.batch;
        let reference = run(
            &plan,
            &[Feed {
                partition: 0,
                batch: batch.clone(),
            }],
            None,
        )?;
        // The same input, batched differently and resumed from a checkpoint
        // in the middle, must give the same bytes.
        let n = batch.num_rows();
        for (size, restore) in [
            (1, None),
            (3, None),
            (7, None),
            (2, Some(n / 4)),
            (1, Some(n / 2)),
        ] {
            let feeds = chunks(&batch, 0, size);
            let restore = restore.filter(|&r| r < feeds.len());
            let got = run(&plan, &feeds, restore)?;
            check_same(
                &reference,
                &got,
                &format!("batch size {size}, restore after batch {restore:?}"),
            )?;
        }
        Ok(DBOutput::Rows {
            types: vec![DefaultColumnType::Any; plan.output_schema.fields().len() + 1],
            rows: reference
                .iter()
                .map(|r| row_of(&plan, r))
                .collect::<Result<_, _>>()?,
        })
    }
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

fn cell(v: Option<&serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => "NULL".into(),
        Some(serde_json::Value::String(s)) if s.is_empty() => "(empty)".into(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn row_of(plan: &QueryPlan, r: &Record) -> Result<Vec<String>, Error> {
    let parse = |s: &str| -> Result<serde_json::Value, Error> {
        serde_json::from_str(s).map_err(|e| Error::Other(e.to_string()))
    };
    let mut row = Vec::new();
    match &r.value {
        Some(v) => {
            let v = parse(v)?;
            row.push("+".into());
            for f in plan.output_schema.fields() {
                row.push(cell(v.get(f.name())));
            }
        }
        None => {
            let k = parse(r.key.as_deref().unwrap_or("{}"))?;
            row.push("-".into());
            for (i, f) in plan.output_schema.fields().iter().enumerate() {
                row.push(if plan.key_columns.contains(&i) {
                    cell(k.get(f.name()))
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
        if trimmed.starts_with("create table") || trimmed.starts_with("insert") {
            let stmts = Parser::parse_sql(&GenericDialect {}, sql)
                .map_err(|e| Error::Other(e.to_string()))?;
            let stmt = &stmts[0];
            return match stmt {
                Statement::CreateTable(_) => {
                    self.create(stmt).map(|_| DBOutput::StatementComplete(0))
                }
                _ => self.insert(stmt).map(DBOutput::StatementComplete),
            };
        }
        self.query(sql)
    }

    fn engine_name(&self) -> &str {
        "ubik"
    }
}

//! Input schemas: declared as a SQL column list
//! (`merchant VARCHAR, ts TIMESTAMP, amount DOUBLE`), as a JSON file, or
//! inferred from a sample of records.
//!
//! `TIMESTAMP` (with or without time zone) is `timestamp(us, UTC)`: input
//! timestamps are instants, given as RFC 3339 or epoch milliseconds.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use sqlparser::ast::{
    ColumnOption, DataType as SqlType, ExactNumberInfo, Statement, TableConstraint, TimezoneInfo,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use ubik_connector::{PRIMARY_KEY_METADATA, RECORD_TIMESTAMP_METADATA};

use crate::error::{FormatError, Result};
use crate::timestamp::parse_timestamp_micros;

pub fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// Parses `name TYPE, name TYPE, ...`.
pub fn parse_column_list(text: &str) -> Result<SchemaRef> {
    let sql = format!("CREATE TABLE t ({text})");
    let statements = Parser::parse_sql(&GenericDialect {}, &sql).map_err(|e| {
        FormatError::Schema(format!(
            "cannot parse the column list {text:?}: {e}; expected e.g. \"merchant VARCHAR, ts TIMESTAMP, amount DOUBLE\""
        ))
    })?;
    let Some(Statement::CreateTable(table)) = statements.first() else {
        return Err(FormatError::Schema(format!(
            "cannot parse the column list {text:?}"
        )));
    };
    let fields = table
        .columns
        .iter()
        .map(|c| {
            Ok(Field::new(
                c.name.value.clone(),
                sql_type(&c.data_type)?,
                true,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    check_unique(&fields)?;
    let mut key: Vec<String> = table
        .columns
        .iter()
        .filter(|c| {
            c.options
                .iter()
                .any(|o| matches!(o.option, ColumnOption::PrimaryKey(_)))
        })
        .map(|c| c.name.value.clone())
        .collect();
    for constraint in &table.constraints {
        if let TableConstraint::PrimaryKey(pk) = constraint {
            key.extend(pk.columns.iter().map(|c| c.column.expr.to_string()));
        }
    }
    let schema = Schema::new(fields);
    if key.is_empty() {
        return Ok(Arc::new(schema));
    }
    if let Some(missing) = key.iter().find(|k| schema.field_with_name(k).is_err()) {
        return Err(FormatError::Schema(format!(
            "PRIMARY KEY names {missing}, which is not a column of {text:?}"
        )));
    }
    let metadata = [(PRIMARY_KEY_METADATA.to_string(), key.join(","))].into();
    Ok(Arc::new(schema.with_metadata(metadata)))
}

pub use ubik_connector::primary_key;

/// The column a versioned table without a TIMESTAMP column gets when its
/// transport stamps each record (a Kafka record timestamp): a version is
/// valid from its record's timestamp.
pub const RECORD_TIMESTAMP_COLUMN: &str = "_timestamp";

/// `schema` plus [`RECORD_TIMESTAMP_COLUMN`], filled from record
/// timestamps, when it declares a primary key and no TIMESTAMP column.
pub fn with_record_timestamp(schema: SchemaRef) -> SchemaRef {
    let has_time = schema
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Timestamp(_, _)));
    if primary_key(&schema).is_empty() || has_time {
        return schema;
    }
    let mut fields = schema.fields().to_vec();
    fields.push(Arc::new(
        Field::new(
            RECORD_TIMESTAMP_COLUMN,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        )
        .with_metadata([(RECORD_TIMESTAMP_METADATA.to_string(), "true".to_string())].into()),
    ));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Maps a SQL type name (as written in a column list) to Arrow.
pub fn sql_type(t: &SqlType) -> Result<DataType> {
    use SqlType::*;
    Ok(match t {
        Varchar(_) | CharVarying(_) | CharacterVarying(_) | Text | String(_) | Char(_)
        | Character(_) | Nvarchar(_) | Uuid | JSON | JSONB => DataType::Utf8,
        Boolean | Bool => DataType::Boolean,
        TinyInt(_) | Int8(_) if matches!(t, TinyInt(_)) => DataType::Int8,
        SmallInt(_) | Int2(_) => DataType::Int16,
        Int(_) | Integer(_) | Int4(_) | MediumInt(_) => DataType::Int32,
        BigInt(_) | Int8(_) | Int64 => DataType::Int64,
        TinyIntUnsigned(_) | UTinyInt => DataType::UInt8,
        SmallIntUnsigned(_) | USmallInt => DataType::UInt16,
        IntUnsigned(_) | IntegerUnsigned(_) | UInt32 => DataType::UInt32,
        BigIntUnsigned(_) | UBigInt | UInt64 => DataType::UInt64,
        Real | Float4 | Float32 => DataType::Float32,
        Float(_) | Double(_) | DoublePrecision | Float8 | Float64 => DataType::Float64,
        Decimal(info) | Numeric(info) | Dec(info) => match info {
            ExactNumberInfo::PrecisionAndScale(p, s) => DataType::Decimal128(*p as u8, *s as i8),
            ExactNumberInfo::Precision(p) => DataType::Decimal128(*p as u8, 0),
            ExactNumberInfo::None => DataType::Decimal128(38, 10),
        },
        Date => DataType::Date32,
        Timestamp(
            _,
            TimezoneInfo::None
            | TimezoneInfo::WithTimeZone
            | TimezoneInfo::WithoutTimeZone
            | TimezoneInfo::Tz,
        )
        | Datetime(_)
        | TimestampNtz(_) => timestamp_type(),
        Bytea | Blob(_) | Binary(_) | Varbinary(_) => DataType::Binary,
        other => {
            return Err(FormatError::Schema(format!(
                "type {other} is not supported in an input schema; use VARCHAR, BIGINT, INT, DOUBLE, REAL, BOOLEAN, DECIMAL(p,s), DATE or TIMESTAMP"
            )));
        }
    })
}

/// A JSON schema file: either `{"col": "SQL TYPE", ...}` (in order) or
/// `[{"name": "col", "type": "SQL TYPE", "nullable": true}, ...]`.
pub fn parse_json_schema(text: &str) -> Result<SchemaRef> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| FormatError::Schema(format!("schema file is not JSON: {e}")))?;
    let mut columns = Vec::new();
    match &value {
        serde_json::Value::Object(map) => {
            for (name, t) in map {
                let t = t.as_str().ok_or_else(|| {
                    FormatError::Schema(format!(
                        "the type of column {name} must be a string like \"VARCHAR\""
                    ))
                })?;
                columns.push(format!("{} {t}", quote_ident(name)));
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                let name = item.get("name").and_then(|n| n.as_str());
                let t = item.get("type").and_then(|n| n.as_str());
                match (name, t) {
                    (Some(n), Some(t)) => columns.push(format!("{} {t}", quote_ident(n))),
                    _ => {
                        return Err(FormatError::Schema(format!(
                            "schema entry {item} needs \"name\" and \"type\""
                        )));
                    }
                }
            }
        }
        _ => {
            return Err(FormatError::Schema(
                "a schema file is a JSON object {\"col\": \"TYPE\"} or a list of {\"name\", \"type\"}".into(),
            ));
        }
    }
    if columns.is_empty() {
        return Err(FormatError::Schema("the schema has no columns".into()));
    }
    parse_column_list(&columns.join(", "))
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn check_unique(fields: &[Field]) -> Result<()> {
    for (i, f) in fields.iter().enumerate() {
        if fields[..i].iter().any(|g| g.name() == f.name()) {
            return Err(FormatError::Schema(format!(
                "column {} is declared twice",
                f.name()
            )));
        }
    }
    Ok(())
}

/// Infers a schema from sample records (JSON objects). Strings that are all
/// RFC 3339 date-times become timestamps. Every JSON number becomes DOUBLE,
/// integers too: JSON has one number type, and a sample whose amounts
/// happen to be whole (`128`) must not fix a BIGINT column that a later
/// `128.5` could not be decoded into, after the first results (and a lake
/// table's column types) were already published. Declare BIGINT where
/// integers are meant (ids, counts).
pub fn infer_schema(records: &[&[u8]]) -> Result<SchemaRef> {
    let mut values = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_slice(r).map_err(|e| {
            FormatError::Schema(format!(
                "cannot infer a schema: sample record {} is not JSON: {e}",
                i + 1
            ))
        })?;
        if !v.is_object() {
            return Err(FormatError::Schema(format!(
                "cannot infer a schema: sample record {} is not a JSON object",
                i + 1
            )));
        }
        values.push(v);
    }
    if values.is_empty() {
        return Err(FormatError::Schema(
            "cannot infer a schema from an empty input; declare it with --schema \"col TYPE, ...\""
                .into(),
        ));
    }
    let inferred = arrow::json::reader::infer_json_schema_from_iterator(values.iter().map(Ok))?;
    let fields: Vec<Field> = inferred
        .fields()
        .iter()
        .map(|f| {
            let dt = match f.data_type() {
                DataType::Utf8 if all_timestamps(&values, f.name()) => timestamp_type(),
                DataType::Int64 => DataType::Float64,
                other => other.clone(),
            };
            Field::new(f.name(), dt, true)
        })
        .collect();
    Ok(Arc::new(Schema::new(Fields::from(fields))))
}

fn all_timestamps(values: &[serde_json::Value], name: &str) -> bool {
    let mut seen = false;
    for v in values {
        match v.get(name) {
            Some(serde_json::Value::String(s)) => {
                // A date-time, not a bare number or date.
                if s.len() < 16 || parse_timestamp_micros(s.as_bytes()).is_none() {
                    return false;
                }
                seen = true;
            }
            Some(serde_json::Value::Null) | None => {}
            Some(_) => return false,
        }
    }
    seen
}

/// `name: TYPE` lines, as `ubik validate` prints schemas.
pub fn describe(schema: &Schema) -> String {
    let mut text = schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ");
    let key = primary_key(schema);
    if !key.is_empty() {
        text.push_str(&format!(", PRIMARY KEY ({})", key.join(", ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_lists() {
        let s = parse_column_list(
            "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE, n BIGINT, d DECIMAL(10,2)",
        )
        .unwrap();
        assert_eq!(s.field(1).data_type(), &timestamp_type());
        assert_eq!(s.field(4).data_type(), &DataType::Decimal128(10, 2));
        assert!(parse_column_list("a VARCHAR, a INT").is_err());
        assert!(parse_column_list("a NOPE").is_err());
        let t = parse_column_list("id VARCHAR PRIMARY KEY, region VARCHAR, ts TIMESTAMP").unwrap();
        assert_eq!(primary_key(&t), ["id"]);
        assert!(describe(&t).ends_with("PRIMARY KEY (id)"));
        let t = parse_column_list("a INT, b INT, PRIMARY KEY (a, b)").unwrap();
        assert_eq!(primary_key(&t), ["a", "b"]);
        assert!(parse_column_list("a INT, PRIMARY KEY (z)").is_err());
        let j = parse_json_schema(r#"{"merchant": "VARCHAR", "ts": "TIMESTAMP"}"#).unwrap();
        assert_eq!(j.field(0).name(), "merchant");
    }

    #[test]
    fn inference() {
        let recs: Vec<&[u8]> = vec![
            br#"{"m":"a","ts":"2024-01-01T00:00:00Z","x":1}"#,
            br#"{"m":"b","ts":"2024-01-01T00:00:01.5Z","x":2.5,"flag":true}"#,
        ];
        let s = infer_schema(&recs).unwrap();
        assert_eq!(
            s.field_with_name("ts").unwrap().data_type(),
            &timestamp_type()
        );
        assert_eq!(
            s.field_with_name("x").unwrap().data_type(),
            &DataType::Float64
        );
        assert_eq!(s.field_with_name("m").unwrap().data_type(), &DataType::Utf8);
        // Whole numbers in the sample still make DOUBLE: a later 128.5 decodes.
        let whole: Vec<&[u8]> = vec![br#"{"amount":128}"#, br#"{"amount":7}"#];
        assert_eq!(
            infer_schema(&whole).unwrap().field(0).data_type(),
            &DataType::Float64
        );
    }
}

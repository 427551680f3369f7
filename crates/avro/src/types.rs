//! Avro types as ubik's columns: the table a subject's schema declares,
//! and the conversion of decoded columns into it.
//!
//! | Avro | column |
//! |---|---|
//! | `boolean`, `int`, `long`, `float`, `double` | BOOLEAN, INT, BIGINT, REAL, DOUBLE |
//! | `string`, `enum`, `string`+`uuid` | VARCHAR (a uuid in its hyphenated form) |
//! | `bytes`, `fixed` | VARBINARY / fixed binary |
//! | `timestamp-millis`, `timestamp-micros` (and `local-` ones) | TIMESTAMP (µs, UTC) |
//! | `date` | DATE |
//! | `decimal` (bytes or fixed) | DECIMAL(p, s) |
//! | `["null", T]` | T, nullable |
//! | `record`, `array`, `map` | STRUCT, LIST, MAP |
//!
//! Every column is nullable, as declared schemas' are: a later schema may
//! make a field optional.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit};

use crate::error::{AvroError, Result};

/// The ubik type of a column arrow-avro decodes as `t`.
pub fn column_type(field: &Field) -> Result<DataType> {
    Ok(match field.data_type() {
        DataType::Timestamp(_, _) => ubik_format::schema::timestamp_type(),
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::Dictionary(_, value) if value.is_string() => DataType::Utf8,
        DataType::FixedSizeBinary(16) if is_uuid(field) => DataType::Utf8,
        DataType::Time32(_) => DataType::Time64(TimeUnit::Microsecond),
        DataType::Struct(fields) => DataType::Struct(column_fields(fields)?),
        DataType::List(item) => DataType::List(column_field(item)?),
        DataType::Union(_, _) => {
            return Err(AvroError::Schema(format!(
                "field {:?} is a union of several types, which ubik does not read; use [\"null\", T] for an optional field",
                field.name()
            )));
        }
        other => other.clone(),
    })
}

fn column_field(field: &FieldRef) -> Result<FieldRef> {
    Ok(Arc::new(Field::new(
        field.name(),
        column_type(field)?,
        true,
    )))
}

fn column_fields(fields: &Fields) -> Result<Fields> {
    fields.iter().map(column_field).collect()
}

fn is_uuid(field: &Field) -> bool {
    field
        .metadata()
        .get("ARROW:extension:name")
        .is_some_and(|n| n == "arrow.uuid")
}

/// The table's schema for the columns arrow-avro decodes.
pub fn table_schema(decoded: &Schema) -> Result<SchemaRef> {
    Ok(Arc::new(Schema::new(column_fields(decoded.fields())?)))
}

/// `column` (decoded as `from`) as a column of type `to`.
pub fn convert(column: &ArrayRef, from: &Field, to: &DataType) -> Result<ArrayRef> {
    if column.data_type() == to {
        return Ok(Arc::clone(column));
    }
    if let (DataType::FixedSizeBinary(16), DataType::Utf8) = (column.data_type(), to)
        && is_uuid(from)
    {
        return Ok(uuid_strings(column));
    }
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    Ok(cast_with_options(column, to, &options)?)
}

fn uuid_strings(column: &ArrayRef) -> ArrayRef {
    let bytes = column.as_fixed_size_binary();
    let mut out = StringBuilder::with_capacity(bytes.len(), bytes.len() * 36);
    let mut text = String::with_capacity(36);
    for i in 0..bytes.len() {
        if bytes.is_null(i) {
            out.append_null();
            continue;
        }
        text.clear();
        for (j, b) in bytes.value(i).iter().enumerate() {
            if matches!(j, 4 | 6 | 8 | 10) {
                text.push('-');
            }
            text.push(char::from_digit((b >> 4) as u32, 16).unwrap_or('0'));
            text.push(char::from_digit((b & 15) as u32, 16).unwrap_or('0'));
        }
        out.append_value(&text);
    }
    Arc::new(out.finish())
}

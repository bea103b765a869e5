//! The subset of JSON Schema that has a Cedar type, and tool arguments converted along it.
//!
//! A [`Shape`] is computed once per tool from its input schema. It gives the tool's
//! `context.args` type in the generated Cedar schema and, at evaluation time, drives the
//! conversion of the (already JSON-Schema-validated) arguments into a Cedar value, so the value
//! always has exactly the type the policies were validated against.

use std::fmt;

use cedar_policy::RestrictedExpression;
use serde_json::{Map, Number, Value, json};

/// The largest integer part a Cedar `decimal` holds (its range is ±922337203685477.5808).
const DECIMAL_INTEGER_LIMIT: u64 = 922_337_203_685_477;

/// A Cedar type that a JSON Schema maps to.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Shape {
    /// `"type": "string"`.
    String,
    /// `"type": "integer"`: a 64-bit signed integer.
    Long,
    /// `"type": "boolean"`.
    Bool,
    /// `"type": "number"`: a `decimal`, rounded to 4 fractional digits.
    Decimal,
    /// `"type": "array"` whose `items` map.
    Set(Box<Shape>),
    /// `"type": "object"`: its properties that map.
    Record(Vec<Field>),
}

/// One attribute of a record shape.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Field {
    pub(crate) name: String,
    pub(crate) shape: Shape,
    /// Not in `required`, or nullable: Cedar has no null, so a null value is left out.
    pub(crate) optional: bool,
}

/// A property of an input schema that has no Cedar type and is left out of the Cedar schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Omission {
    /// Dotted path below `context.args`, e.g. `filters.state`; `[]` stands for array items.
    pub(crate) path: String,
    pub(crate) reason: &'static str,
}

/// Why an argument value could not be converted to its Cedar type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConversionError {
    /// Path to the offending value, e.g. `items[2].sku`; empty for the arguments themselves.
    path: String,
    problem: String,
}

impl Shape {
    /// The record shape of a tool's arguments. Properties without a Cedar type are left out and
    /// reported in `omitted`; a schema that is not an object schema gives an empty record.
    pub(crate) fn for_arguments(input_schema: &Value, omitted: &mut Vec<Omission>) -> Shape {
        match map_schema(input_schema, "", omitted) {
            Ok((Shape::Record(fields), _nullable)) => Shape::Record(fields),
            Ok(_) => {
                omitted.push(Omission {
                    path: String::new(),
                    reason: "the input schema is not an object schema",
                });
                Shape::Record(Vec::new())
            }
            Err(reason) => {
                omitted.push(Omission {
                    path: String::new(),
                    reason,
                });
                Shape::Record(Vec::new())
            }
        }
    }

    /// This shape as a type in Cedar's JSON schema format.
    pub(crate) fn to_cedar_json(&self) -> Value {
        match self {
            Shape::String => json!({"type": "String"}),
            Shape::Long => json!({"type": "Long"}),
            Shape::Bool => json!({"type": "Boolean"}),
            Shape::Decimal => json!({"type": "Extension", "name": "decimal"}),
            Shape::Set(element) => json!({"type": "Set", "element": element.to_cedar_json()}),
            Shape::Record(fields) => {
                let mut attributes = Map::new();
                for field in fields {
                    let mut attribute = field.shape.to_cedar_json();
                    if let Value::Object(attribute) = &mut attribute {
                        attribute.insert("required".to_owned(), Value::Bool(!field.optional));
                    }
                    attributes.insert(field.name.clone(), attribute);
                }
                json!({"type": "Record", "attributes": attributes})
            }
        }
    }

    /// Converts a JSON value of this shape to a Cedar value. Record properties that are not in
    /// the shape are dropped; a value of the wrong type is an error, never a panic.
    pub(crate) fn convert(&self, value: &Value) -> Result<RestrictedExpression, ConversionError> {
        match (self, value) {
            (Shape::String, Value::String(text)) => {
                Ok(RestrictedExpression::new_string(text.clone()))
            }
            (Shape::Bool, Value::Bool(flag)) => Ok(RestrictedExpression::new_bool(*flag)),
            (Shape::Long, Value::Number(number)) => match long_value(number) {
                Some(long) => Ok(RestrictedExpression::new_long(long)),
                None => Err(ConversionError::here(
                    "is not an integer between -9223372036854775808 and 9223372036854775807",
                )),
            },
            (Shape::Decimal, Value::Number(number)) => match decimal_literal(number) {
                Some(literal) => Ok(RestrictedExpression::new_decimal(literal)),
                None => Err(ConversionError::here(
                    "is outside the range of a Cedar decimal (about ±9.2e14)",
                )),
            },
            (Shape::Set(element), Value::Array(items)) => {
                let mut converted = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    let item = element
                        .convert(item)
                        .map_err(|error| error.within(&format!("[{index}]")))?;
                    converted.push(item);
                }
                Ok(RestrictedExpression::new_set(converted))
            }
            (Shape::Record(fields), Value::Object(properties)) => {
                let mut pairs = Vec::with_capacity(fields.len());
                for field in fields {
                    let value = match properties.get(&field.name) {
                        None | Some(Value::Null) if field.optional => continue,
                        None => {
                            return Err(ConversionError::here("is required but missing")
                                .within(&field.name));
                        }
                        Some(value) => value,
                    };
                    let converted = field
                        .shape
                        .convert(value)
                        .map_err(|error| error.within(&field.name))?;
                    pairs.push((field.name.clone(), converted));
                }
                RestrictedExpression::new_record(pairs)
                    .map_err(|error| ConversionError::here(&error.to_string()))
            }
            (shape, _) => Err(ConversionError::here(&format!(
                "is not {}",
                shape.described()
            ))),
        }
    }

    fn described(&self) -> &'static str {
        match self {
            Shape::String => "a string",
            Shape::Long => "an integer",
            Shape::Bool => "a boolean",
            Shape::Decimal => "a number",
            Shape::Set(_) => "an array",
            Shape::Record(_) => "an object",
        }
    }
}

impl ConversionError {
    fn here(problem: &str) -> ConversionError {
        ConversionError {
            path: String::new(),
            problem: problem.to_owned(),
        }
    }

    /// Prefixes the path with a property name or an `[index]` segment.
    fn within(mut self, segment: &str) -> ConversionError {
        let joined = if self.path.is_empty() || self.path.starts_with('[') {
            format!("{segment}{}", self.path)
        } else {
            format!("{segment}.{}", self.path)
        };
        self.path = joined;
        self
    }
}

impl fmt::Display for ConversionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "the arguments value {}", self.problem)
        } else {
            write!(f, "argument `{}` {}", self.path, self.problem)
        }
    }
}

/// Maps one JSON Schema to a shape and whether it admits null. `path` names it for omissions.
fn map_schema(
    schema: &Value,
    path: &str,
    omitted: &mut Vec<Omission>,
) -> Result<(Shape, bool), &'static str> {
    let (type_name, nullable) = declared_type(schema)?;
    let shape = match type_name {
        "string" => Shape::String,
        "integer" => Shape::Long,
        "boolean" => Shape::Bool,
        "number" => Shape::Decimal,
        "array" => {
            let Some(items) = schema.get("items").filter(|items| items.is_object()) else {
                return Err("it is an array without a single `items` schema");
            };
            let (element, element_nullable) = map_schema(items, &format!("{path}[]"), omitted)?;
            if element_nullable {
                return Err("its items may be null, which a Cedar set cannot hold");
            }
            Shape::Set(Box::new(element))
        }
        "object" => Shape::Record(map_properties(schema, path, omitted)),
        "null" => return Err("it only allows null"),
        _ => return Err("its `type` is not a JSON Schema type"),
    };
    Ok((shape, nullable))
}

fn map_properties(schema: &Value, path: &str, omitted: &mut Vec<Omission>) -> Vec<Field> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields = Vec::with_capacity(properties.len());
    for (name, property) in properties {
        let property_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        match map_schema(property, &property_path, omitted) {
            Ok((shape, nullable)) => fields.push(Field {
                name: name.clone(),
                shape,
                optional: nullable || !required.contains(&name.as_str()),
            }),
            Err(reason) => omitted.push(Omission {
                path: property_path,
                reason,
            }),
        }
    }
    fields
}

/// The one non-null type a schema declares, and whether it also admits null.
fn declared_type(schema: &Value) -> Result<(&str, bool), &'static str> {
    match schema.get("type") {
        Some(Value::String(type_name)) => Ok((type_name, false)),
        Some(Value::Array(type_names)) => {
            let mut nullable = false;
            let mut found = None;
            for type_name in type_names {
                match type_name.as_str() {
                    Some("null") => nullable = true,
                    Some(other) => {
                        if found.replace(other).is_some() {
                            return Err("it allows several types");
                        }
                    }
                    None => return Err("its `type` is not a JSON Schema type"),
                }
            }
            match found {
                Some(type_name) => Ok((type_name, nullable)),
                None => Err("it only allows null"),
            }
        }
        Some(_) => Err("its `type` is not a JSON Schema type"),
        None => Err("it declares no `type` (for example oneOf, anyOf or $ref)"),
    }
}

fn long_value(number: &Number) -> Option<i64> {
    if let Some(long) = number.as_i64() {
        return Some(long);
    }
    // JSON Schema counts 3.0 as an integer; a float has no lossless `as` conversion, so go
    // through its exact decimal text, which fails for anything outside the i64 range.
    let float = number.as_f64()?;
    if float.fract() != 0.0 {
        return None;
    }
    format!("{float:.0}").parse().ok()
}

/// The `decimal("...")` literal of a number: exact for integers, rounded to 4 fractional digits
/// otherwise; `None` outside the decimal range.
fn decimal_literal(number: &Number) -> Option<String> {
    if let Some(long) = number.as_i64() {
        return (long.unsigned_abs() <= DECIMAL_INTEGER_LIMIT).then(|| format!("{long}.0"));
    }
    if number.is_u64() {
        // Larger than i64::MAX, so far outside the decimal range.
        return None;
    }
    let float = number.as_f64()?;
    // 922337203685477.0 is exactly representable; anything below it rounds to at most that.
    let limit = 922_337_203_685_477.0_f64;
    if float.is_finite() && float.abs() < limit {
        Some(format!("{float:.4}"))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(schema: Value) -> (Shape, Vec<Omission>) {
        let mut omitted = Vec::new();
        let shape = Shape::for_arguments(&schema, &mut omitted);
        (shape, omitted)
    }

    #[test]
    fn json_schema_types_map_to_cedar_types() {
        let (shape, omitted) = shape(json!({
            "type": "object",
            "required": ["name", "count", "maybe"],
            "properties": {
                "name": {"type": "string"},
                "count": {"type": "integer"},
                "flag": {"type": "boolean"},
                "ratio": {"type": "number"},
                "maybe": {"type": ["string", "null"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "filters": {"type": "object", "properties": {"state": {"type": "string"}}},
                "untyped": {"description": "anything"},
                "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                "mixed": {"type": ["string", "integer"]},
                "tuple": {"type": "array", "items": [{"type": "string"}]},
                "nested_bad": {"type": "object", "properties": {"x": {}}}
            }
        }));
        let Shape::Record(fields) = shape else {
            panic!("arguments must map to a record")
        };
        let found: Vec<(&str, &Shape, bool)> = fields
            .iter()
            .map(|f| (f.name.as_str(), &f.shape, f.optional))
            .collect();
        assert_eq!(
            found,
            vec![
                ("name", &Shape::String, false),
                ("count", &Shape::Long, false),
                ("flag", &Shape::Bool, true),
                ("ratio", &Shape::Decimal, true),
                ("maybe", &Shape::String, true),
                ("tags", &Shape::Set(Box::new(Shape::String)), true),
                (
                    "filters",
                    &Shape::Record(vec![Field {
                        name: "state".into(),
                        shape: Shape::String,
                        optional: true
                    }]),
                    true
                ),
                ("nested_bad", &Shape::Record(Vec::new()), true),
            ]
        );
        let paths: Vec<&str> = omitted.iter().map(|o| o.path.as_str()).collect();
        assert_eq!(
            paths,
            vec!["untyped", "either", "mixed", "tuple", "nested_bad.x"]
        );
    }

    #[test]
    fn numbers_convert_to_longs_and_decimals() {
        let longs: &[(Value, Option<i64>)] = &[
            (json!(42), Some(42)),
            (json!(-3), Some(-3)),
            (json!(3.0), Some(3)),
            (json!(3.5), None),
            (json!(u64::MAX), None),
            (json!(1e300), None),
        ];
        for (value, expected) in longs {
            let Value::Number(number) = value else {
                unreachable!()
            };
            assert_eq!(long_value(number), *expected, "{value}");
            assert_eq!(
                Shape::Long.convert(value).is_ok(),
                expected.is_some(),
                "{value}"
            );
        }
        let decimals: &[(Value, Option<&str>)] = &[
            (json!(10), Some("10.0")),
            (json!(12.5), Some("12.5000")),
            (json!(0.123456), Some("0.1235")),
            (json!(-7.25), Some("-7.2500")),
            (json!(922_337_203_685_477_i64), Some("922337203685477.0")),
            (json!(922_337_203_685_478_i64), None),
            (json!(1e15), None),
            (json!(u64::MAX), None),
        ];
        for (value, expected) in decimals {
            let Value::Number(number) = value else {
                unreachable!()
            };
            assert_eq!(decimal_literal(number).as_deref(), *expected, "{value}");
            assert_eq!(
                Shape::Decimal.convert(value).is_ok(),
                expected.is_some(),
                "{value}"
            );
        }
        assert!(Shape::String.convert(&json!(5)).is_err());
        assert!(Shape::Bool.convert(&json!("true")).is_err());
    }

    #[test]
    fn conversion_errors_name_the_argument() {
        let (shape, _) = shape(json!({
            "type": "object",
            "required": ["items"],
            "properties": {"items": {"type": "array", "items": {
                "type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}
            }}}
        }));
        let err = shape
            .convert(&json!({"items": [{"sku": "a"}, {"sku": 7}]}))
            .unwrap_err();
        assert_eq!(err.to_string(), "argument `items[1].sku` is not a string");
        let err = shape.convert(&json!({})).unwrap_err();
        assert_eq!(err.to_string(), "argument `items` is required but missing");
        let err = shape.convert(&json!([1])).unwrap_err();
        assert_eq!(err.to_string(), "the arguments value is not an object");
    }
}

//! Metadata values.

use std::fmt;

/// One GGUF metadata value. Strings that are not valid UTF-8 are decoded lossily (U+FFFD):
/// tokenizer vocabularies occasionally hold raw bytes, and tilekit never needs them exact.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum MetadataValue {
    /// `GGUF_TYPE_UINT8`.
    U8(u8),
    /// `GGUF_TYPE_INT8`.
    I8(i8),
    /// `GGUF_TYPE_UINT16`.
    U16(u16),
    /// `GGUF_TYPE_INT16`.
    I16(i16),
    /// `GGUF_TYPE_UINT32`.
    U32(u32),
    /// `GGUF_TYPE_INT32`.
    I32(i32),
    /// `GGUF_TYPE_FLOAT32`.
    F32(f32),
    /// `GGUF_TYPE_BOOL`.
    Bool(bool),
    /// `GGUF_TYPE_STRING`.
    String(String),
    /// `GGUF_TYPE_ARRAY`: values of one type (nested arrays allowed).
    Array(Vec<MetadataValue>),
    /// `GGUF_TYPE_UINT64`.
    U64(u64),
    /// `GGUF_TYPE_INT64`.
    I64(i64),
    /// `GGUF_TYPE_FLOAT64`.
    F64(f64),
}

impl MetadataValue {
    /// The value as a `u64`, for any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => Some(v),
            MetadataValue::I8(v) => u64::try_from(v).ok(),
            MetadataValue::I16(v) => u64::try_from(v).ok(),
            MetadataValue::I32(v) => u64::try_from(v).ok(),
            MetadataValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as an `i64`, for any integer type whose value fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetadataValue::I8(v) => Some(v.into()),
            MetadataValue::I16(v) => Some(v.into()),
            MetadataValue::I32(v) => Some(v.into()),
            MetadataValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as an `f64`, for the two float types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            MetadataValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// GGUF's name for the value's type (`u32`, `string`, `array`, …).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetadataValue::U8(_) => "u8",
            MetadataValue::I8(_) => "i8",
            MetadataValue::U16(_) => "u16",
            MetadataValue::I16(_) => "i16",
            MetadataValue::U32(_) => "u32",
            MetadataValue::I32(_) => "i32",
            MetadataValue::F32(_) => "f32",
            MetadataValue::Bool(_) => "bool",
            MetadataValue::String(_) => "string",
            MetadataValue::Array(_) => "array",
            MetadataValue::U64(_) => "u64",
            MetadataValue::I64(_) => "i64",
            MetadataValue::F64(_) => "f64",
        }
    }
}

impl fmt::Display for MetadataValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataValue::U8(v) => write!(f, "{v}u8"),
            MetadataValue::I8(v) => write!(f, "{v}i8"),
            MetadataValue::U16(v) => write!(f, "{v}u16"),
            MetadataValue::I16(v) => write!(f, "{v}i16"),
            MetadataValue::U32(v) => write!(f, "{v}u32"),
            MetadataValue::I32(v) => write!(f, "{v}i32"),
            MetadataValue::F32(v) => write!(f, "{v}f32"),
            MetadataValue::Bool(v) => write!(f, "{v}"),
            MetadataValue::String(v) => write!(f, "{v:?}"),
            MetadataValue::Array(v) => write!(f, "array of {} values", v.len()),
            MetadataValue::U64(v) => write!(f, "{v}u64"),
            MetadataValue::I64(v) => write!(f, "{v}i64"),
            MetadataValue::F64(v) => write!(f, "{v}f64"),
        }
    }
}

//! Parsing and validating everything before the data section.

use std::collections::HashMap;

use super::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GgufError, MAX_DIMS, MetadataValue};
use crate::quant::GgmlType;
use crate::quant::types::ggml_block_geometry;

/// Arrays nested deeper than this are refused, so a crafted file cannot exhaust the stack.
const MAX_ARRAY_DEPTH: usize = 8;

/// One tensor info, validated.
#[derive(Clone, Debug)]
pub(super) struct RawTensorInfo {
    pub name: String,
    pub type_id: u32,
    /// Numpy order (GGUF's `ne` reversed).
    pub shape: Vec<usize>,
    /// From the start of the data section.
    pub offset: u64,
    /// Bytes of data, where the type is one ggml knows.
    pub bytes: Option<u64>,
}

/// Everything before the data section, validated against the file's length.
#[derive(Debug)]
pub(super) struct Header {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, MetadataValue)>,
    pub metadata_index: HashMap<String, usize>,
    pub tensors: Vec<RawTensorInfo>,
    pub by_name: HashMap<String, usize>,
    pub data_offset: u64,
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn len(&self) -> u64 {
        self.buf.len() as u64
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn truncated(&self, what: impl Into<String>, n: u64) -> GgufError {
        GgufError::Truncated {
            what: what.into(),
            offset: self.pos as u64,
            end: (self.pos as u64).saturating_add(n),
            len: self.len(),
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => {
                let s = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(self.truncated(what, n)),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then that many bytes.
    fn string_bytes(&mut self, what: &str) -> Result<&'a [u8], GgufError> {
        let n = self.u64(what)?;
        self.take(n, what)
    }

    /// A string that must be UTF-8 (keys, tensor names).
    fn utf8(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let b = self.string_bytes(what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| GgufError::Malformed { what: format!("{what} is not valid UTF-8"), offset: at })
    }

    fn malformed(&self, at: usize, what: String) -> GgufError {
        GgufError::Malformed { what, offset: at as u64 }
    }

    /// A metadata value of type `ty`.
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetadataValue, GgufError> {
        use MetadataValue as V;
        let what = format!("the value of {key:?}");
        let what = what.as_str();
        Ok(match ty {
            0 => V::U8(self.array::<1>(what)?[0]),
            1 => V::I8(i8::from_le_bytes(self.array(what)?)),
            2 => V::U16(u16::from_le_bytes(self.array(what)?)),
            3 => V::I16(i16::from_le_bytes(self.array(what)?)),
            4 => V::U32(u32::from_le_bytes(self.array(what)?)),
            5 => V::I32(i32::from_le_bytes(self.array(what)?)),
            6 => V::F32(f32::from_le_bytes(self.array(what)?)),
            7 => {
                let at = self.pos;
                match self.array::<1>(what)?[0] {
                    0 => V::Bool(false),
                    1 => V::Bool(true),
                    b => return Err(self.malformed(at, format!("{what} is a bool stored as {b}, not 0 or 1"))),
                }
            }
            8 => V::String(String::from_utf8_lossy(self.string_bytes(what)?).into_owned()),
            9 => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.malformed(at, format!("{what} nests arrays deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                // The smallest encoding of one element: a fixed-size value, or an empty string
                // (8 bytes) or empty array (12 bytes). A count the rest of the file cannot hold
                // is a truncation, found before anything is allocated.
                let min_size = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    10..=12 | 8 => 8,
                    9 => 12,
                    _ => return Err(self.malformed(at, format!("{what} is an array of unknown value type {elem}"))),
                };
                if count.checked_mul(min_size).is_none_or(|n| n > self.remaining() as u64) {
                    return Err(self.truncated(format!("{what} ({count} elements)"), count.saturating_mul(min_size)));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                V::Array(items)
            }
            10 => V::U64(u64::from_le_bytes(self.array(what)?)),
            11 => V::I64(i64::from_le_bytes(self.array(what)?)),
            12 => V::F64(f64::from_le_bytes(self.array(what)?)),
            _ => {
                let at = self.pos - 4;
                return Err(self.malformed(at, format!("{what} has unknown value type {ty}")));
            }
        })
    }
}

/// Parses and validates the header, metadata and tensor infos of `buf`, a whole GGUF file.
pub(super) fn parse(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0 };

    if buf.len() < 4 || buf[..4] != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: buf[..buf.len().min(4)].to_vec() });
    }
    c.pos = 4;
    let version = c.u32("the version")?;
    if version != 2 && version != 3 {
        let hint = match version {
            1 => " (version 1, from before August 2023, used 32-bit counts)",
            v if matches!(v.swap_bytes(), 2 | 3) => " (this is a big-endian file)",
            _ => "",
        };
        return Err(GgufError::UnsupportedVersion { version, hint });
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the metadata count")?;

    // Each metadata entry takes at least 8 + 4 + 1 bytes, each tensor info 8 + 4 + 4 + 8, so
    // the counts bound the allocations only as far as the file's length allows.
    let mut metadata = Vec::with_capacity(bounded(n_kv, c.remaining(), 13));
    let mut keys = HashMap::with_capacity(bounded(n_kv, c.remaining(), 13));
    for i in 0..n_kv {
        let key = c.utf8(&format!("metadata key {i}"))?;
        let ty = c.u32(&format!("the value type of {key:?}"))?;
        let value = c.value(ty, &key, 0)?;
        if keys.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey { key });
        }
        metadata.push((key, value));
    }

    let alignment = match keys.get(ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(MetadataValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(v) => return Err(GgufError::BadAlignment { found: v.to_string() }),
    };

    let mut tensors = Vec::with_capacity(bounded(n_tensors, c.remaining(), 24));
    let mut by_name = HashMap::with_capacity(bounded(n_tensors, c.remaining(), 24));
    for i in 0..n_tensors {
        let info_at = c.pos;
        let name = c.utf8(&format!("the name of tensor {i}"))?;
        let n_dims = c.u32(&format!("the dimension count of {name:?}"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims { name, n_dims });
        }
        let mut ne = [0u64; MAX_DIMS];
        for d in ne.iter_mut().take(n_dims as usize) {
            *d = c.u64(&format!("the dimensions of {name:?}"))?;
        }
        let type_id = c.u32(&format!("the type of {name:?}"))?;
        let offset = c.u64(&format!("the offset of {name:?}"))?;
        if offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor { name, offset, alignment });
        }
        let shape = shape_of(&name, &ne[..n_dims as usize]).map_err(|what| c.malformed(info_at, what))?;
        let bytes = byte_size(&name, &shape, type_id, info_at as u64)?;
        if by_name.insert(name.clone(), tensors.len()).is_some() {
            return Err(GgufError::DuplicateTensor { name });
        }
        tensors.push(RawTensorInfo { name, type_id, shape, offset, bytes });
    }

    // The data section starts at the next multiple of the alignment. A file without tensors
    // may end right here.
    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    if !tensors.is_empty() && data_offset > c.len() {
        return Err(GgufError::Truncated {
            what: "the padding before the data section".into(),
            offset: c.pos as u64,
            end: data_offset,
            len: c.len(),
        });
    }
    for t in &tensors {
        let Some(bytes) = t.bytes else { continue };
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(bytes));
        if end.is_none_or(|e| e > c.len()) {
            return Err(GgufError::Truncated {
                what: format!("the data of tensor {:?} ({bytes} bytes)", t.name),
                offset: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                len: c.len(),
            });
        }
    }

    Ok(Header { version, alignment, metadata, metadata_index: keys, tensors, by_name, data_offset })
}

/// `count` capped by how many entries of at least `min_size` bytes `remaining` bytes can hold.
fn bounded(count: u64, remaining: usize, min_size: usize) -> usize {
    usize::try_from(count).unwrap_or(usize::MAX).min(remaining / min_size)
}

/// The numpy-order shape of GGUF dimensions `ne`, each checked to be below 2⁶³ (ggml stores
/// them as `int64_t`) and to fit `usize`.
fn shape_of(name: &str, ne: &[u64]) -> Result<Vec<usize>, String> {
    ne.iter()
        .rev()
        .map(|&d| {
            usize::try_from(d)
                .ok()
                .filter(|_| i64::try_from(d).is_ok())
                .ok_or_else(|| format!("tensor {name:?} has a dimension of {d} elements, beyond what ggml can index"))
        })
        .collect()
}

/// The data size of a tensor whose type ggml knows, checking the row length against the block
/// size as llama.cpp does on load; `None` for a type id ggml does not know (such a tensor is
/// refused when it is asked for). `at` is the tensor info's offset in the file.
fn byte_size(name: &str, shape: &[usize], type_id: u32, at: u64) -> Result<Option<u64>, GgufError> {
    if let Some(ty) = GgmlType::from_id(type_id) {
        return ty
            .tensor_bytes(shape)
            .map(|b| Some(b as u64))
            .map_err(|source| GgufError::BadShape { name: name.to_string(), source });
    }
    let Some((block_size, block_bytes)) = ggml_block_geometry(type_id) else {
        return Ok(None);
    };
    // A type tilekit does not read: the same arithmetic, for the bounds check.
    let k = shape.last().copied().unwrap_or(1);
    if k % block_size != 0 {
        return Err(GgufError::Malformed {
            what: format!(
                "tensor {name:?} has rows of {k} elements, not a multiple of its type's block size {block_size}"
            ),
            offset: at,
        });
    }
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
    Ok(Some(elements.and_then(|n| (n / block_size as u64).checked_mul(block_bytes as u64)).unwrap_or(u64::MAX)))
}

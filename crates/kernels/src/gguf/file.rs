//! [`GgufFile`]: an opened GGUF file and its tensors.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use super::parse::{RawTensorInfo, parse};
use super::{GgufError, MetadataValue};
use crate::quant::{self, GgmlType, QuantError, ggml_type_name};

/// The file's bytes: a read-only memory map, or a buffer the caller handed over.
enum Backing {
    Mmap(memmap2::Mmap),
    Bytes(Vec<u8>),
}

impl Deref for Backing {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Bytes(b) => b,
        }
    }
}

/// An opened, validated GGUF file: its metadata, tensor infos and (memory-mapped) data.
pub struct GgufFile {
    bytes: Backing,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, MetadataValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    data_offset: u64,
}

impl GgufFile {
    /// Opens `path`, maps it read-only and validates it (see the [module docs](super)).
    ///
    /// The map is shared with the file: another process truncating or rewriting the file while
    /// it is open changes (or, for a truncation, invalidates) the bytes tensors return — the
    /// usual contract of memory-mapped model files, as in llama.cpp. Use
    /// [`GgufFile::from_bytes`]`(std::fs::read(path)?)` to read a private copy instead.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // An empty file cannot be mapped on every platform; it is refused as any other
            // file too short to be GGUF.
            return GgufFile::from_bytes(Vec::new());
        }
        // SAFETY: the map is read-only and lives as long as `self`, and every slice handed out
        // borrows `self`. Its contents can still change if another process modifies the file;
        // that is documented above, and tilekit reads no memory outside the map's length.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        GgufFile::new(Backing::Mmap(map))
    }

    /// Parses a GGUF file already in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::new(Backing::Bytes(bytes))
    }

    fn new(bytes: Backing) -> Result<GgufFile, GgufError> {
        let h = parse(&bytes)?;
        let tensors = h.tensors.into_iter().map(TensorInfo::from).collect();
        Ok(GgufFile {
            bytes,
            version: h.version,
            alignment: h.alignment,
            metadata: h.metadata,
            metadata_index: h.metadata_index,
            tensors,
            by_name: h.by_name,
            data_offset: h.data_offset,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data-section alignment: `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The file offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    /// The metadata value under `key`.
    pub fn metadata_value(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Every tensor info, in file order, including tensors of types tilekit does not read.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`: its type, numpy-order shape and raw bytes (borrowed from the
    /// map). Errors: no such tensor, or a type tilekit does not read.
    pub fn tensor(&self, name: &str) -> Result<GgufTensor<'_>, GgufError> {
        let info = self
            .by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::NoSuchTensor { name: name.to_string() })?;
        let ty = info.ggml_type().ok_or_else(|| GgufError::UnsupportedTensorType {
            name: info.name.clone(),
            type_id: info.type_id,
            type_name: ggml_type_name(info.type_id),
        })?;
        // Validated when the file was opened: the range lies inside the file.
        let start = (self.data_offset + info.offset) as usize;
        let data = &self.bytes[start..start + info.bytes.unwrap_or(0) as usize];
        Ok(GgufTensor { name: &info.name, ty, shape: &info.shape, data })
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("len", &self.bytes.len())
            .field("mapped", &matches!(self.bytes, Backing::Mmap(_)))
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// One tensor info as the file declares it (whatever its type).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    type_id: u32,
    shape: Vec<usize>,
    offset: u64,
    bytes: Option<u64>,
}

impl From<RawTensorInfo> for TensorInfo {
    fn from(r: RawTensorInfo) -> TensorInfo {
        TensorInfo { name: r.name, type_id: r.type_id, shape: r.shape, offset: r.offset, bytes: r.bytes }
    }
}

impl TensorInfo {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// ggml's type id as stored.
    pub fn type_id(&self) -> u32 {
        self.type_id
    }

    /// The type, if tilekit reads it.
    pub fn ggml_type(&self) -> Option<GgmlType> {
        GgmlType::from_id(self.type_id)
    }

    /// ggml's name for the type, if ggml knows the id.
    pub fn type_name(&self) -> Option<&'static str> {
        ggml_type_name(self.type_id)
    }

    /// The shape in numpy order (GGUF's `ne` reversed: a `[N, K]` weight has `ne0 = K`).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The data's offset from the start of the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The data's size in bytes, if ggml knows the type.
    pub fn byte_len(&self) -> Option<u64> {
        self.bytes
    }
}

/// A tensor of a supported type, borrowed from a [`GgufFile`].
#[derive(Clone, Copy, Debug)]
pub struct GgufTensor<'a> {
    name: &'a str,
    ty: GgmlType,
    shape: &'a [usize],
    data: &'a [u8],
}

impl<'a> GgufTensor<'a> {
    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// Its type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Its shape in numpy order (`[N, K]` for a weight whose rows have `K` elements).
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }

    /// The number of elements.
    pub fn element_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The raw bytes, exactly `ggml_type().tensor_bytes(shape())` of them: little-endian
    /// elements for the dense types, blocks for the quantized ones.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The values as `f32`, dequantized (or widened) as llama.cpp does.
    pub fn dequantize(&self) -> Result<Vec<f32>, QuantError> {
        quant::dequantize(self.ty, self.data, self.shape)
    }
}

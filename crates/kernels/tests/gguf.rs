//! The GGUF reader against files written by the `gguf` package's `GGUFWriter`
//! (`fixtures/gguf/`, made by `fixtures/make_quant_fixtures.py`), and against corrupted files:
//! variants of those fixtures and files assembled here byte by byte.

use proptest::prelude::*;
use tilekit_kernels::gguf::{GgufError, GgufFile, MetadataValue};
use tilekit_kernels::quant::{GgmlType, QuantError, dequantize, quantize};

fn path(name: &str) -> String {
    format!("{}/tests/fixtures/gguf/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn bytes(name: &str) -> Vec<u8> {
    std::fs::read(path(name)).unwrap_or_else(|e| panic!("{name}: {e} (run tests/fixtures/make_quant_fixtures.py)"))
}

/// The script's `dense_values`: (i − 7) / 4, exact in f32, f16 and bf16.
fn dense_values(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - 7.0) / 4.0).collect()
}

/// The script's `weight_values`: ((i · 37 + 11) mod 101 − 50) / 8.
fn weight_values(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 + 11) % 101) as f32 / 8.0 - 50.0 / 8.0).collect()
}

/// The script's `raw_bytes`: (i · 73 + salt) mod 256.
fn raw_bytes(n: usize, salt: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 73 + salt) % 256) as u8).collect()
}

#[test]
fn reads_every_tensor_type_written_by_gguf_writer() {
    let mapped = GgufFile::open(path("tensors.gguf")).expect("a valid file");
    let in_memory = GgufFile::from_bytes(bytes("tensors.gguf")).expect("a valid file");
    for f in [&mapped, &in_memory] {
        assert_eq!((f.version(), f.alignment()), (3, 32));
        assert_eq!(f.data_offset() % 32, 0);
        let names: Vec<_> = f.tensor_infos().iter().map(|t| t.name()).collect();
        assert_eq!(
            names,
            [
                "dense.f32",
                "dense.f16",
                "dense.bf16",
                "vec.f32",
                "cube.f32",
                "w.q8_0",
                "w.q4_0",
                "w.q4_1",
                "w.q4_k",
                "w.q6_k",
                "w.q5_0"
            ]
        );
        for t in f.tensor_infos() {
            assert_eq!(t.offset() % 32, 0, "{}", t.name());
        }

        // Dense tensors: numpy-order shapes, values exact.
        for (name, ty, shape) in [
            ("dense.f32", GgmlType::F32, vec![3, 5]),
            ("dense.f16", GgmlType::F16, vec![2, 7]),
            ("dense.bf16", GgmlType::Bf16, vec![4, 3]),
            ("vec.f32", GgmlType::F32, vec![6]),
            ("cube.f32", GgmlType::F32, vec![2, 3, 4]),
        ] {
            let t = f.tensor(name).expect("present and supported");
            assert_eq!((t.name(), t.ggml_type(), t.shape()), (name, ty, &shape[..]));
            let n: usize = shape.iter().product();
            assert_eq!(t.element_count(), n);
            assert_eq!(t.data().len(), n * ty.block_bytes());
            assert_eq!(t.dequantize().expect("valid"), dense_values(n), "{name}");
        }

        // Quantized by gguf.quants in the script: our quantizer writes the same bytes.
        for (name, ty, shape) in [
            ("w.q8_0", GgmlType::Q8_0, [3, 64]),
            ("w.q4_0", GgmlType::Q4_0, [2, 96]),
            ("w.q4_1", GgmlType::Q4_1, [2, 64]),
        ] {
            let t = f.tensor(name).expect("present and supported");
            assert_eq!((t.ggml_type(), t.shape()), (ty, &shape[..]), "{name}");
            let ours = quantize(ty, &weight_values(shape[0] * shape[1]), &shape).expect("in range");
            assert_eq!(t.data(), &ours[..], "{name}");
            assert_eq!(t.dequantize().expect("valid"), dequantize(ty, &ours, &shape).expect("valid"));
        }
        // Raw k-quant blocks.
        for (name, ty, shape, salt) in [("w.q4_k", GgmlType::Q4K, [2, 256], 1), ("w.q6_k", GgmlType::Q6K, [1, 512], 2)]
        {
            let t = f.tensor(name).expect("present and supported");
            assert_eq!((t.ggml_type(), t.shape()), (ty, &shape[..]), "{name}");
            assert_eq!(t.data(), &raw_bytes(ty.tensor_bytes(&shape).expect("whole blocks"), salt)[..], "{name}");
        }
    }
}

#[test]
fn reads_metadata_of_every_value_type() {
    let f = GgufFile::open(path("tensors.gguf")).expect("a valid file");
    use MetadataValue as V;
    let v = |k: &str| f.metadata_value(k).unwrap_or_else(|| panic!("no {k}")).clone();
    assert_eq!(v("general.architecture"), V::String("llama".into()));
    assert_eq!(v("general.name").as_str(), Some("tilekit-fixture"));
    assert_eq!(v("test.u8"), V::U8(200));
    assert_eq!(v("test.i8"), V::I8(-100));
    assert_eq!(v("test.u16"), V::U16(60000));
    assert_eq!(v("test.i16"), V::I16(-30000));
    assert_eq!(v("test.u32"), V::U32(4_000_000_000));
    assert_eq!(v("test.i32"), V::I32(-2_000_000_000));
    assert_eq!(v("test.f32"), V::F32(0.15625));
    assert_eq!(v("test.u64"), V::U64(18_000_000_000_000_000_000));
    assert_eq!(v("test.i64"), V::I64(-9_000_000_000_000_000_000));
    assert_eq!(v("test.f64"), V::F64(-2.5e-300));
    assert_eq!(v("test.bool"), V::Bool(true));
    assert_eq!(v("test.string").as_str(), Some("tilekit \u{fc}n\u{ef}c\u{f8}de \u{2713}"));
    assert_eq!(v("test.array_i32"), V::Array(vec![V::I32(1), V::I32(-2), V::I32(3)]));
    assert_eq!(
        v("test.array_str"),
        V::Array(vec![V::String("a".into()), V::String("".into()), V::String("\u{e9}t\u{e9}".into())])
    );
    assert_eq!(v("test.array_f32"), V::Array(vec![V::F32(0.5), V::F32(-1.25)]));
    assert_eq!(v("test.array_nested"), V::Array(vec![V::Array(vec![V::I32(1), V::I32(2)]), V::Array(vec![V::I32(3)])]));
    assert_eq!(v("test.u32").as_u64(), Some(4_000_000_000));
    assert_eq!(v("test.i8").as_u64(), None);
    assert_eq!(v("test.i8").as_i64(), Some(-100));
    assert_eq!(f.metadata_value("test.missing"), None);
    assert_eq!(f.metadata().first().map(|(k, _)| k.as_str()), Some("general.architecture"));
}

#[test]
fn honours_a_custom_alignment() {
    let f = GgufFile::open(path("aligned64.gguf")).expect("a valid file");
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.metadata_value("general.alignment"), Some(&MetadataValue::U32(64)));
    assert_eq!(f.data_offset() % 64, 0);
    let offsets: Vec<u64> = f.tensor_infos().iter().map(|t| t.offset()).collect();
    assert_eq!(offsets, [0, 64, 128]); // 12, 34 and 10 bytes, each padded to 64
    assert_eq!(f.tensor("a.f32").expect("present").dequantize().expect("valid"), dense_values(3));
    assert_eq!(f.tensor("c.f16").expect("present").dequantize().expect("valid"), dense_values(5));
    let q = f.tensor("b.q8_0").expect("present");
    assert_eq!(q.data(), &quantize(GgmlType::Q8_0, &weight_values(32), &[1, 32]).expect("in range")[..]);
}

#[test]
fn unsupported_types_and_missing_names_are_typed_errors() {
    let f = GgufFile::open(path("tensors.gguf")).expect("a valid file");
    let info = f.tensor_infos().iter().find(|t| t.name() == "w.q5_0").expect("listed");
    assert_eq!(
        (info.type_id(), info.type_name(), info.ggml_type(), info.shape()),
        (6, Some("Q5_0"), None, &[1, 32][..])
    );
    assert_eq!(info.byte_len(), Some(22));
    match f.tensor("w.q5_0") {
        Err(e @ GgufError::UnsupportedTensorType { type_id: 6, type_name: Some("Q5_0"), .. }) => {
            assert!(e.to_string().contains("Q5_0"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(f.tensor("w.q8"), Err(GgufError::NoSuchTensor { name }) if name == "w.q8"));
    assert!(matches!(GgufFile::open(path("no-such-file.gguf")), Err(GgufError::Io { .. })));
}

#[test]
fn corrupted_headers_are_typed_errors() {
    let good = bytes("tensors.gguf");
    let with = |at: usize, b: &[u8]| {
        let mut v = good.clone();
        v[at..at + b.len()].copy_from_slice(b);
        GgufFile::from_bytes(v)
    };
    assert!(matches!(with(0, b"GGML"), Err(GgufError::BadMagic { found }) if found == b"GGML"));
    assert!(matches!(GgufFile::from_bytes(b"GG".to_vec()), Err(GgufError::BadMagic { .. })));
    assert!(matches!(GgufFile::from_bytes(Vec::new()), Err(GgufError::BadMagic { .. })));
    assert!(matches!(with(4, &1u32.to_le_bytes()), Err(GgufError::UnsupportedVersion { version: 1, .. })));
    assert!(matches!(with(4, &4u32.to_le_bytes()), Err(GgufError::UnsupportedVersion { version: 4, .. })));
    match with(4, &3u32.to_be_bytes()) {
        Err(e @ GgufError::UnsupportedVersion { .. }) => assert!(e.to_string().contains("big-endian"), "{e}"),
        other => panic!("{other:?}"),
    }
    // Version 2 has the same layout as 3.
    assert_eq!(with(4, &2u32.to_le_bytes()).expect("version 2").version(), 2);
    // A tensor count far beyond what the file holds: a truncation, found without allocating.
    assert!(matches!(with(8, &(u64::MAX / 2).to_le_bytes()), Err(GgufError::Truncated { .. })));
    assert!(matches!(with(16, &(u64::MAX / 2).to_le_bytes()), Err(GgufError::Truncated { .. })));
}

#[test]
fn every_truncation_is_a_typed_error() {
    let good = bytes("tensors.gguf");
    let f = GgufFile::from_bytes(good.clone()).expect("valid");
    let last = f.tensor_infos().last().expect("tensors");
    // Only the padding after the last tensor's data may go missing.
    let data_end = (f.data_offset() + last.offset() + last.byte_len().expect("known type")) as usize;
    assert!(data_end < good.len());
    for len in data_end..good.len() {
        assert!(GgufFile::from_bytes(good[..len].to_vec()).is_ok(), "cut to {len}");
    }
    for len in 0..data_end {
        match GgufFile::from_bytes(good[..len].to_vec()) {
            Err(GgufError::BadMagic { .. }) => assert!(len < 4),
            Err(GgufError::Truncated { len: l, end, .. }) => assert!(l == len as u64 && end > l, "{len}"),
            other => panic!("a file cut to {len} of {} bytes: {other:?}", good.len()),
        }
    }
    // The last tensor's data is what a file one byte short of it lacks.
    match GgufFile::from_bytes(good[..data_end - 1].to_vec()) {
        Err(e @ GgufError::Truncated { .. }) => assert!(e.to_string().contains("w.q5_0"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// A GGUF file assembled field by field, for the corruptions `GGUFWriter` cannot make.
#[derive(Default)]
struct Builder {
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

impl Builder {
    fn string(out: &mut Vec<u8>, s: &[u8]) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s);
    }

    /// A metadata entry with a raw value type and value bytes.
    fn kv(mut self, key: &[u8], ty: u32, value: &[u8]) -> Self {
        Self::string(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
        self
    }

    /// A tensor info (`ne` in GGUF order) and `data_len` bytes of data.
    fn tensor(mut self, name: &[u8], ne: &[u64], ty: u32, offset: u64, data_len: usize) -> Self {
        Self::string(&mut self.infos, name);
        self.infos.extend((ne.len() as u32).to_le_bytes());
        for d in ne {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(ty.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        if data_len > 0 {
            self.data.resize(self.data.len().max(offset as usize + data_len), 0x5A);
        }
        self
    }

    fn build(&self, alignment: usize) -> Vec<u8> {
        let mut f = b"GGUF".to_vec();
        f.extend(3u32.to_le_bytes());
        f.extend(self.n_tensors.to_le_bytes());
        f.extend(self.n_kv.to_le_bytes());
        f.extend(&self.kv);
        f.extend(&self.infos);
        f.resize(f.len().next_multiple_of(alignment), 0);
        f.extend(&self.data);
        f
    }

    fn open(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.build(32))
    }
}

fn q8_0_tensor() -> Builder {
    Builder::default().tensor(b"w", &[64, 2], GgmlType::Q8_0.id(), 0, 4 * 34)
}

#[test]
fn the_builder_makes_valid_files() {
    let f = q8_0_tensor().kv(b"general.alignment", 4, &32u32.to_le_bytes()).open().expect("valid");
    let t = f.tensor("w").expect("present");
    assert_eq!((t.shape(), t.data().len()), (&[2, 64][..], 136));
    let f = Builder::default().open().expect("no tensors, no metadata");
    assert!(f.tensor_infos().is_empty() && f.metadata().is_empty());
}

#[test]
fn bad_alignments_are_typed_errors() {
    for (ty, value) in
        [(4u32, 0u32.to_le_bytes().to_vec()), (4, 48u32.to_le_bytes().to_vec()), (10, 32u64.to_le_bytes().to_vec())]
    {
        let r = q8_0_tensor().kv(b"general.alignment", ty, &value).open();
        assert!(matches!(r, Err(GgufError::BadAlignment { .. })), "type {ty} value {value:?}: {r:?}");
    }
    // An offset that is not a multiple of the alignment.
    let r = Builder::default().tensor(b"w", &[32], GgmlType::Q8_0.id(), 16, 34).open();
    assert!(matches!(r, Err(GgufError::MisalignedTensor { offset: 16, alignment: 32, .. })), "{r:?}");
}

#[test]
fn bad_tensor_infos_are_typed_errors() {
    let id = GgmlType::F32.id();
    let r = Builder::default().tensor(b"t", &[1, 1, 1, 1, 1], id, 0, 4).open();
    assert!(matches!(r, Err(GgufError::TooManyDims { n_dims: 5, .. })), "{r:?}");
    let r = Builder::default().tensor(b"t", &[1], id, 0, 4).tensor(b"t", &[1], id, 32, 4).open();
    assert!(matches!(r, Err(GgufError::DuplicateTensor { ref name }) if name == "t"), "{r:?}");
    // K = 48 is not a multiple of Q8_0's 32.
    let r = Builder::default().tensor(b"w", &[48, 2], GgmlType::Q8_0.id(), 0, 102).open();
    assert!(
        matches!(r, Err(GgufError::BadShape { source: QuantError::RowNotBlockMultiple { k: 48, .. }, .. })),
        "{r:?}"
    );
    // The same for a type tilekit does not read (Q5_K: 256 per block).
    let r = Builder::default().tensor(b"w", &[128], 13, 0, 88).open();
    assert!(matches!(r, Err(GgufError::Malformed { .. })), "{r:?}");
    // A dimension beyond int64_t.
    let r = Builder::default().tensor(b"t", &[1 << 63], id, 0, 0).open();
    assert!(matches!(r, Err(GgufError::Malformed { .. })), "{r:?}");
    // Sizes that overflow.
    let r = Builder::default().tensor(b"t", &[1 << 40, 1 << 40], id, 0, 0).open();
    assert!(matches!(r, Err(GgufError::BadShape { source: QuantError::Overflow { .. }, .. })), "{r:?}");
    // Data past the end of the file.
    let mut b = Builder::default().tensor(b"t", &[8], id, 0, 32);
    b.data.truncate(31);
    assert!(matches!(b.open(), Err(GgufError::Truncated { .. })));
    let r = Builder::default().tensor(b"t", &[1], id, u64::MAX - 31, 0).open();
    assert!(matches!(r, Err(GgufError::Truncated { .. })), "{r:?}");
    // A name that is not UTF-8.
    let r = Builder::default().tensor(b"\xFF\xFE", &[1], id, 0, 4).open();
    assert!(matches!(r, Err(GgufError::Malformed { .. })), "{r:?}");
    // A type id ggml does not know: the file opens, the tensor is refused by name.
    let f = Builder::default().tensor(b"odd", &[3], 99, 0, 0).tensor(b"x", &[1], id, 0, 4).open().expect("opens");
    assert!(matches!(f.tensor("odd"), Err(GgufError::UnsupportedTensorType { type_id: 99, type_name: None, .. })));
    assert_eq!(f.tensor("x").expect("readable").dequantize().expect("valid").len(), 1);
}

#[test]
fn bad_metadata_is_a_typed_error() {
    let base = q8_0_tensor;
    let r = base().kv(b"k", 4, &[1, 0, 0, 0]).kv(b"k", 4, &[2, 0, 0, 0]).open();
    assert!(matches!(r, Err(GgufError::DuplicateKey { ref key }) if key == "k"), "{r:?}");
    let r = base().kv(b"k", 13, &[0; 8]).open();
    assert!(matches!(r, Err(GgufError::Malformed { .. })), "{r:?}");
    let r = base().kv(b"k", 7, &[2]).open();
    assert!(matches!(r, Err(GgufError::Malformed { .. })), "{r:?}");
    let r = base().kv(b"\xC3", 7, &[1]).open();
    assert!(matches!(r, Err(GgufError::Malformed { .. })), "{r:?}");
    // An array count far beyond the file: refused before allocating.
    let mut v = 10u32.to_le_bytes().to_vec();
    v.extend((1u64 << 60).to_le_bytes());
    let r = base().kv(b"k", 9, &v).open();
    assert!(matches!(r, Err(GgufError::Truncated { .. })), "{r:?}");
    // An array of an unknown element type.
    let mut v = 42u32.to_le_bytes().to_vec();
    v.extend(1u64.to_le_bytes());
    let r = base().kv(b"k", 9, &v).open();
    assert!(matches!(r, Err(GgufError::Malformed { .. })), "{r:?}");
    // Arrays nested nine deep (one of one of … one u8).
    let mut v = Vec::new();
    for _ in 0..9 {
        v.extend(9u32.to_le_bytes());
        v.extend(1u64.to_le_bytes());
    }
    v.extend(0u32.to_le_bytes());
    v.extend(1u64.to_le_bytes());
    v.push(7);
    let r = base().kv(b"k", 9, &v).open();
    assert!(matches!(r, Err(GgufError::Malformed { ref what, .. }) if what.contains("deeper")), "{r:?}");
    // A string value that is not UTF-8 is decoded lossily, not refused.
    let mut v = 2u64.to_le_bytes().to_vec();
    v.extend(b"\xFFa");
    let f = base().kv(b"k", 8, &v).open().expect("opens");
    assert_eq!(f.metadata_value("k").and_then(|v| v.as_str()), Some("\u{FFFD}a"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any corruption of a real file opens or fails with an error; it never panics, and
    /// whatever opens hands out tensors whose bytes lie inside the file.
    #[test]
    fn corrupted_files_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut b = bytes("tensors.gguf");
        // The flips land before the data section, where they matter.
        let header_end = GgufFile::from_bytes(b.clone()).expect("valid").data_offset() as usize;
        for (at, v) in flips {
            let i = at.index(header_end);
            b[i] ^= v;
        }
        if let Ok(f) = GgufFile::from_bytes(b) {
            for t in f.tensor_infos() {
                if let Ok(t) = f.tensor(t.name()) {
                    prop_assert_eq!(t.data().len(), t.ggml_type().tensor_bytes(t.shape()).expect("validated on open"));
                    let _ = t.dequantize();
                }
            }
        }
    }
}

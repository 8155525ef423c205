//! Reading and writing the `.npy` files of `cargo xtask run` (through the `npyz` crate).
//!
//! Inputs are C-order float32 or float16 arrays; outputs are always float32. Every problem with
//! a file (missing, truncated, wrong dtype, Fortran order, a header that claims more data than
//! the file holds) is an error naming the file, never a panic.

use crate::util::one_line;
use anyhow::{Context, Result, anyhow, bail};
use npyz::WriterBuilder;
use std::path::Path;

/// A dense, C-order array read from a `.npy` file, widened to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// The shape as written in the file.
    pub shape: Vec<usize>,
    /// The elements in C order.
    pub data: Vec<f32>,
}

/// Reads a float32 or float16 `.npy` file.
pub fn read(path: &Path) -> Result<Array> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&bytes).with_context(|| format!("{} is not a usable .npy file", path.display()))
}

/// Parses the bytes of a `.npy` file.
pub fn parse(bytes: &[u8]) -> Result<Array> {
    // npyz multiplies the dimensions without an overflow check, so a hostile header could make
    // it panic; check the shape ourselves first.
    check_header_shape(bytes)?;
    let file = npyz::NpyFile::new(bytes).map_err(|e| anyhow!("malformed header: {}", one_line(&e.to_string())))?;
    if file.order() == npyz::Order::Fortran {
        bail!("the array is in Fortran order; save a C-order array (numpy.ascontiguousarray)");
    }
    let shape: Vec<usize> = file
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .context("a dimension is too large")?;
    let ts = match file.dtype() {
        npyz::DType::Plain(ts) => ts,
        other => bail!("dtype {} is not supported: use float32 or float16", other.descr()),
    };
    let (ty, size) = (ts.type_char(), ts.size_field());
    if ty != npyz::TypeChar::Float || !(size == 4 || size == 2) {
        bail!("dtype {ts} is not supported: use float32 (<f4) or float16 (<f2)");
    }
    // A header may claim more elements than the file holds; refuse before allocating for them.
    let needed = file.len().checked_mul(size).context("the element count overflows")?;
    if needed > bytes.len() as u64 {
        bail!("the header promises {} elements ({needed} bytes) but the file has {} bytes", file.len(), bytes.len());
    }
    let data = if size == 4 {
        file.into_vec::<f32>().map_err(|e| anyhow!("truncated or unreadable data: {}", one_line(&e.to_string())))?
    } else {
        file.into_vec::<half::f16>()
            .map_err(|e| anyhow!("truncated or unreadable data: {}", one_line(&e.to_string())))?
            .into_iter()
            .map(f32::from)
            .collect()
    };
    Ok(Array { shape, data })
}

/// Finds the `'shape': (...)` entry of the header dictionary and checks that the product of
/// its non-zero dimensions fits in 64 bits (which bounds every partial product npyz forms).
fn check_header_shape(bytes: &[u8]) -> Result<()> {
    // Magic (6 bytes), version (2), header length (2 bytes in v1, 4 in v2/v3), then the text.
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        bail!("missing the .npy magic bytes");
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => bail!("unsupported .npy format version {v}"),
    };
    let header = bytes.get(start..start.saturating_add(len)).context("the header is truncated")?;
    let header = String::from_utf8_lossy(header);
    let Some(pos) = header.find("'shape'") else { return Ok(()) };
    let rest = &header[pos..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else { return Ok(()) };
    if close < open {
        return Ok(());
    }
    let mut product: u64 = 1;
    for dim in rest[open + 1..close].split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Ok(d) = dim.trim_end_matches('L').parse::<u64>() else {
            bail!("the shape entry {dim:?} is not a non-negative integer");
        };
        if d != 0 {
            product = product.checked_mul(d).context("the shape's element count overflows")?;
        }
    }
    Ok(())
}

/// Writes `data` as a C-order float32 array of `shape`.
pub fn write(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    let bytes = to_bytes(shape, data)?;
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// The bytes of a C-order float32 `.npy` file.
pub fn to_bytes(shape: &[usize], data: &[f32]) -> Result<Vec<u8>> {
    to_bytes_as(shape, data.iter().copied())
}

/// The bytes of a C-order `.npy` file of any element type npyz writes.
pub fn to_bytes_as<T: npyz::AutoSerialize>(shape: &[usize], data: impl IntoIterator<Item = T>) -> Result<Vec<u8>> {
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut out = Vec::new();
    let mut writer = npyz::WriteOptions::new().default_dtype().shape(&shape).writer(&mut out).begin_nd()?;
    writer.extend(data)?;
    writer.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trips_f32_and_reads_f16() {
        let a = parse(&to_bytes(&[2, 3], &[1., 2., 3., 4., 5., -6.5]).unwrap()).unwrap();
        assert_eq!(a, Array { shape: vec![2, 3], data: vec![1., 2., 3., 4., 5., -6.5] });
        let h = to_bytes_as(&[3], [0.5f32, -2.0, 65504.0].map(half::f16::from_f32)).unwrap();
        assert_eq!(parse(&h).unwrap().data, vec![0.5, -2.0, 65504.0]);
    }

    /// A version-1 `.npy` file with the given header dictionary and data bytes.
    fn raw(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut header = format!("{dict}\n");
        while (10 + header.len()) % 64 != 0 {
            header.insert(header.len() - 1, ' ');
        }
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn raw_builder_matches_npyz() {
        let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let a = parse(&raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", &data)).unwrap();
        assert_eq!(a.data, vec![1.0, 2.0]);
    }

    #[test]
    fn rejects_bad_files_with_errors() {
        let good = to_bytes(&[4, 4], &[1.0; 16]).unwrap();
        let data = vec![0u8; 64];
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", good[..good.len() - 3].to_vec()),
            ("header", good[..20].to_vec()),
            ("magic", b"hello world, not an npy file".to_vec()),
            ("magic", Vec::new()),
            ("not supported", to_bytes_as(&[2], [1.0f64, 2.0]).unwrap()),
            ("not supported", to_bytes_as(&[2], [1i32, 2]).unwrap()),
            ("Fortran", raw("{'descr': '<f4', 'fortran_order': True, 'shape': (4, 4), }", &data)),
            (
                "overflows",
                raw("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", &data),
            ),
            ("promises", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (9999999,), }", &data)),
            ("non-negative", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", &data)),
            ("header", raw("{'descr': '<f4', 'fortran_order'", &data)),
        ];
        for (expect, case) in &cases {
            let msg = format!("{:#}", parse(case).expect_err("a bad file must be rejected"));
            assert!(msg.contains(expect), "expected {expect:?} in {msg:?}");
            assert!(!msg.contains('\n'), "an error must be one line: {msg}");
        }
    }
}

//! The `.npy` files of the `mobilenet_v2` example: a float32 (or float16) C-order input, float32
//! logits out. Problems are one-line errors naming the file.

use crate::ModelError;
use npyz::WriterBuilder;
use std::path::Path;

fn err(path: &Path, reason: impl std::fmt::Display) -> ModelError {
    let reason = reason.to_string().replace('\n', " ");
    ModelError::Input(format!("{}: {reason}", path.display()))
}

/// Reads a C-order float32 or float16 array: `(shape, values as f32)`.
pub fn read(path: &Path) -> Result<(Vec<usize>, Vec<f32>), ModelError> {
    let bytes =
        std::fs::read(path).map_err(|e| ModelError::Io { path: path.display().to_string(), reason: e.to_string() })?;
    let file = npyz::NpyFile::new(&bytes[..]).map_err(|e| err(path, format!("not a .npy file ({e})")))?;
    if file.order() == npyz::Order::Fortran {
        return Err(err(path, "Fortran order; save a C-order array"));
    }
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let size = match file.dtype() {
        npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::Float => ts.size_field(),
        other => return Err(err(path, format!("dtype {} is not supported: use float32", other.descr()))),
    };
    if !(size == 4 || size == 2) || count.and_then(|c| c.checked_mul(size as usize)).is_none_or(|b| b > bytes.len()) {
        return Err(err(path, format!("shape {shape:?} of {size}-byte floats does not fit the file (use float32)")));
    }
    let data = if size == 4 {
        file.into_vec::<f32>().map_err(|e| err(path, e))?
    } else {
        file.into_vec::<half::f16>().map_err(|e| err(path, e))?.into_iter().map(f32::from).collect()
    };
    Ok((shape, data))
}

/// Writes a float32 C-order array.
pub fn write(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), ModelError> {
    let io = |e: std::io::Error| ModelError::Io { path: path.display().to_string(), reason: e.to_string() };
    let file = std::fs::File::create(path).map_err(io)?;
    let shape64: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&shape64)
        .writer(std::io::BufWriter::new(file))
        .begin_nd()
        .map_err(io)?;
    w.extend(data.iter().copied()).map_err(io)?;
    w.finish().map_err(io)
}

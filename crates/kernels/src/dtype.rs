//! Storage element types.

use std::fmt;

/// The element type a tensor is stored in. Every kernel accumulates in `f32` whatever the
/// storage type, and rounds once (to nearest even) when it stores a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`): the top 16 bits of an `f32`.
    Bf16,
}

impl DType {
    /// Every dtype, in a fixed order (tests iterate over this).
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// The lower-case name used in kernel entry points, file names and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }

    /// Unit roundoff of the storage format (half the distance from 1 to the next value).
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => 5.960_464_477_539_063e-8, // 2^-24
            DType::F16 => 4.882_812_5e-4,           // 2^-11
            DType::Bf16 => 3.906_25e-3,             // 2^-8
        }
    }

    /// Rounds an `f32` to this storage format (nearest even) and back. Goes through
    /// `half`'s `from_f32`, which rounds correctly, never through `from_f64`, which truncates
    /// first (see `shared/FIELD-NOTES.md`).
    pub fn round_f32(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::F16 => half::f16::from_f32(x).to_f32(),
            DType::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }

    /// Parses the names printed by [`DType::name`].
    pub fn parse(s: &str) -> Option<DType> {
        match s {
            "f32" => Some(DType::F32),
            "f16" => Some(DType::F16),
            "bf16" => Some(DType::Bf16),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_names() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::parse("f64"), None);
    }

    #[test]
    fn rounding_is_nearest_even() {
        // 1 + 2^-8 + 2^-40 must round up in bf16 (it is above the halfway point), which a
        // truncating conversion would get wrong.
        let x = 1.0f32 + 2f32.powi(-8) + 2f32.powi(-20);
        assert_eq!(DType::Bf16.round_f32(x), 1.0 + 2f32.powi(-7));
        // Exactly halfway rounds to even.
        assert_eq!(DType::Bf16.round_f32(1.0 + 2f32.powi(-8)), 1.0);
    }
}

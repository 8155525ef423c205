//! Freed output buffers kept for reuse.
//!
//! Every op that makes its output allocates it, and the allocation was a zeroed one: for the
//! buffers of MobileNetV2's first layers (1.3–1.6 MB) `calloc` took 65–80 µs (it zeroes memory
//! the allocator hands back from earlier frees), about a tenth of the network's time on 2
//! cores, though every op writes its whole output before anything reads it. So a host buffer
//! of at least [`MIN_BYTES`] that tilekit owns goes, when its last tensor is dropped, onto a
//! shelf of its element type, and an op's output ([`take`], through `alloc_output`) is a buffer
//! of exactly its length from there when one is (the newest such), else a new zeroed one. The
//! shelves hold at most [`KEEP_BYTES`] together per type, the oldest buffers freed first past
//! that; `Device::zeros` and uploads never take from them.
//!
//! A reused buffer holds the numbers of the tensor it last was. Debug builds keep buffers of
//! every size and fill a reused one with NaN before handing it out, so a kernel that read its
//! output before writing it would show in every test that runs an op twice on one size.

use super::aligned::AlignedBuf;
use half::{bf16, f16};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// The least buffer kept (smaller ones cost the allocator little). Debug builds keep every
/// buffer, so that the NaN a reused output starts with reaches every kernel's tests (their
/// shapes are small).
pub(super) const MIN_BYTES: usize = if cfg!(debug_assertions) { 1 } else { 64 << 10 };

/// The most bytes of buffers kept per element type.
pub(super) const KEEP_BYTES: usize = 64 << 20;

/// The buffers of one element type, oldest first, and their bytes.
pub(super) struct Shelf<T> {
    bufs: VecDeque<AlignedBuf<T>>,
    bytes: usize,
}

impl<T> Shelf<T> {
    const fn new() -> Shelf<T> {
        Shelf { bufs: VecDeque::new(), bytes: 0 }
    }
}

/// An element type with a shelf.
pub(super) trait Recycle: Copy + Sized + 'static {
    /// This type's shelf.
    fn shelf() -> MutexGuard<'static, Shelf<Self>>;
    /// What debug builds fill a reused buffer with.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    const POISON: Self;
}

fn lock<T>(m: &'static Mutex<Shelf<T>>) -> MutexGuard<'static, Shelf<T>> {
    // A panic while the shelf was held leaves whole buffers on it: still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static F32: Mutex<Shelf<f32>> = Mutex::new(Shelf::new());
static F16: Mutex<Shelf<f16>> = Mutex::new(Shelf::new());
static BF16: Mutex<Shelf<bf16>> = Mutex::new(Shelf::new());

impl Recycle for f32 {
    fn shelf() -> MutexGuard<'static, Shelf<f32>> {
        lock(&F32)
    }
    const POISON: f32 = f32::NAN;
}

impl Recycle for f16 {
    fn shelf() -> MutexGuard<'static, Shelf<f16>> {
        lock(&F16)
    }
    const POISON: f16 = f16::NAN;
}

impl Recycle for bf16 {
    fn shelf() -> MutexGuard<'static, Shelf<bf16>> {
        lock(&BF16)
    }
    const POISON: bf16 = bf16::NAN;
}

/// A kept buffer of exactly `len` elements (the newest), if there is one.
pub(super) fn take<T: Recycle>(len: usize) -> Option<AlignedBuf<T>> {
    if len * size_of::<T>() < MIN_BYTES {
        return None;
    }
    let mut shelf = T::shelf();
    let i = shelf.bufs.iter().rposition(|b| b.len() == len)?;
    let buf = shelf.bufs.remove(i)?;
    shelf.bytes -= len * size_of::<T>();
    drop(shelf);
    #[cfg(debug_assertions)]
    let buf = {
        let mut buf = buf;
        buf.fill(T::POISON);
        buf
    };
    Some(buf)
}

/// Keeps `buf` for a later [`take`] (if it is large enough), freeing the oldest kept buffers
/// past [`KEEP_BYTES`].
pub(super) fn give<T: Recycle>(buf: AlignedBuf<T>) {
    let bytes = buf.len() * size_of::<T>();
    if !(MIN_BYTES..=KEEP_BYTES).contains(&bytes) {
        return;
    }
    let mut freed = Vec::new();
    {
        let mut shelf = T::shelf();
        shelf.bufs.push_back(buf);
        shelf.bytes += bytes;
        while shelf.bytes > KEEP_BYTES {
            let Some(old) = shelf.bufs.pop_front() else { break };
            shelf.bytes -= old.len() * size_of::<T>();
            freed.push(old);
        }
    }
    // Freed outside the lock.
    drop(freed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers of `len` elements on `T`'s shelf, and the shelf's bytes.
    fn count<T: Recycle>(len: usize) -> (usize, usize) {
        let shelf = T::shelf();
        (shelf.bufs.iter().filter(|b| b.len() == len).count(), shelf.bytes)
    }

    /// A buffer of `len` copies of `v`.
    fn filled<T: Recycle + bytemuck::Zeroable>(len: usize, v: T) -> AlignedBuf<T> {
        let mut b = AlignedBuf::try_zeroed(len).expect("a small buffer");
        b.fill(v);
        b
    }

    // Lengths no other test's outputs have (the shelves are shared by the whole test binary).

    #[test]
    fn a_given_buffer_is_taken_once_by_its_exact_length() {
        let len = 70_001;
        give(filled(len, 1.5f32));
        assert!(take::<f32>(len - 1).is_none_or(|b| b.len() == len - 1));
        let got = take::<f32>(len).expect("the buffer just given");
        assert_eq!(got.len(), len);
        // Debug builds hand it out as NaN, release builds as it was.
        if cfg!(debug_assertions) {
            assert!(got.iter().all(|v| v.is_nan()));
        } else {
            assert!(got.iter().all(|&v| v == 1.5));
        }
        assert!(take::<f32>(len).is_none(), "taken twice");
    }

    #[test]
    fn small_buffers_are_not_kept() {
        if MIN_BYTES > 2 {
            let small = MIN_BYTES / 2 - 1;
            give(filled(small, f16::ONE));
            assert_eq!(count::<f16>(small).0, 0);
            assert!(take::<f16>(small).is_none());
        }
    }

    #[test]
    fn the_shelf_keeps_at_most_its_bytes_dropping_the_oldest() {
        let len = KEEP_BYTES / 2 / 3 + 11; // three bf16 buffers are just over a third of the cap each
        for i in 0..5u16 {
            give(filled(len, bf16::from_bits(i)));
            assert!(count::<bf16>(len).1 <= KEEP_BYTES);
        }
        let (n, _) = count::<bf16>(len);
        assert!((1..=2).contains(&n), "{n} buffers of {len}");
        // The newest are kept: the last one given comes back first.
        if !cfg!(debug_assertions) {
            assert_eq!(take::<bf16>(len).expect("kept")[0], bf16::from_bits(4));
        }
        while take::<bf16>(len).is_some() {}
    }
}

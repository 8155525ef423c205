//! Host buffers that start on a 64-byte boundary: the storage of every tensor the CPU backend
//! allocates (`alloc_output`, `Device::zeros`, uploads) and of the kept outputs in
//! [`super::recycle`].
//!
//! The allocator's own alignment is 16 bytes, and a large block (`malloc`'s `mmap`ped chunks)
//! starts 16 bytes past a page boundary. The kernels step through the channels, pixels and
//! columns of a tensor in whole vectors from its first element, so with such a start every
//! second 32-byte AVX2 access and every 64-byte AVX-512 one straddles two cache lines, which
//! costs the load or store a second line access. Aligned, none does.
//!
//! The block is taken with the allocator's zeroing path (`calloc`, whose fresh pages need no
//! `memset`) at the element type's own alignment, [`ALIGN`] bytes longer than the elements,
//! and the elements start at its first 64-byte boundary. (Asking the allocator for 64-byte
//! alignment would go through `posix_memalign` and a `memset` of the whole block.)

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fmt;
use std::ptr::NonNull;

/// The alignment of the first element: a cache line, one AVX-512 vector.
pub(crate) const ALIGN: usize = 64;

/// `len` elements of `T` from a 64-byte boundary, owned (as a `Vec<T>` without spare capacity).
pub(crate) struct AlignedBuf<T> {
    /// The allocated block (dangling when nothing was allocated: `len` 0 or a zero-sized `T`).
    block: NonNull<u8>,
    /// The first element, `block` moved up to the next multiple of [`ALIGN`].
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: the buffer owns its elements as a `Vec<T>` does; sending or sharing it sends or
// shares them.
unsafe impl<T: Send> Send for AlignedBuf<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for AlignedBuf<T> {}

impl<T> AlignedBuf<T> {
    /// The block holding `len` elements from a 64-byte boundary, or `None` if its size
    /// overflows.
    fn block_layout(len: usize) -> Option<Layout> {
        let bytes = size_of::<T>().checked_mul(len)?.checked_add(ALIGN)?;
        Layout::from_size_align(bytes, align_of::<T>()).ok()
    }

    /// An empty buffer (nothing allocated).
    pub(crate) const fn empty() -> AlignedBuf<T> {
        AlignedBuf { block: NonNull::dangling(), ptr: NonNull::dangling(), len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl<T: bytemuck::Zeroable> AlignedBuf<T> {
    /// `len` zeroed elements, or `None` when the allocation fails or its size overflows.
    pub(crate) fn try_zeroed(len: usize) -> Option<AlignedBuf<T>> {
        if len == 0 || size_of::<T>() == 0 {
            return Some(AlignedBuf { len, ..AlignedBuf::empty() });
        }
        let layout = Self::block_layout(len)?;
        // SAFETY: the layout's size is at least ALIGN, not zero.
        let block = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        // The block is aligned for `T` and ALIGN is a multiple of `T`'s alignment (both powers
        // of two, `T`'s at most 16 here), so the offset keeps `ptr` aligned for `T`; it is
        // below ALIGN, so the `len` elements end inside the block.
        let offset = block.as_ptr().addr().wrapping_neg() % ALIGN;
        debug_assert!(offset.is_multiple_of(align_of::<T>()));
        // SAFETY: `offset < ALIGN` and the block is `size_of::<T>() · len + ALIGN` bytes long.
        let ptr = unsafe { block.add(offset) }.cast::<T>();
        // Zeroed bytes are valid elements (`Zeroable`).
        Some(AlignedBuf { block, ptr, len })
    }

    /// [`AlignedBuf::try_zeroed`] for the kernels' small per-thread scratch buffers, whose
    /// callers cannot return an error: a failed allocation ends the process through
    /// [`std::alloc::handle_alloc_error`], as a `Vec` of that size would.
    pub(crate) fn zeroed(len: usize) -> AlignedBuf<T> {
        match AlignedBuf::try_zeroed(len) {
            Some(b) => b,
            None => std::alloc::handle_alloc_error(Self::block_layout(len).unwrap_or_else(Layout::new::<[u8; ALIGN]>)),
        }
    }
}

impl<T> Default for AlignedBuf<T> {
    fn default() -> AlignedBuf<T> {
        AlignedBuf::empty()
    }
}

impl<T> Drop for AlignedBuf<T> {
    fn drop(&mut self) {
        if self.len == 0 || size_of::<T>() == 0 {
            return; // Nothing was allocated.
        }
        // The elements are plain data here (f32, f16, bf16) but dropped properly all the same.
        // SAFETY: `ptr` points to `len` initialised elements that are not used again.
        unsafe { std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)) };
        if let Some(layout) = Self::block_layout(self.len) {
            // SAFETY: `block` was allocated with this layout (the one `try_zeroed` computed for
            // the same `len`).
            unsafe { dealloc(self.block.as_ptr(), layout) };
        }
    }
}

impl<T> std::ops::Deref for AlignedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points to `len` initialised elements owned by `self` (or is dangling
        // and aligned for `T` with `len` 0 or `T` zero-sized).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for AlignedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> fmt::Debug for AlignedBuf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn check<T: bytemuck::Zeroable + Copy + PartialEq + fmt::Debug>(one: T) {
        for len in [1, 2, 3, 15, 16, 17, 1000, 4097, 70_000, 300_001] {
            let mut b = AlignedBuf::<T>::try_zeroed(len).expect("a small allocation");
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr().addr() % ALIGN, 0, "{len} elements");
            assert!(b.iter().all(|&v| v == T::zeroed()), "zeroed");
            // Every element is writable and reads back: the block holds them all.
            b.fill(one);
            assert!(b.iter().all(|&v| v == one));
        }
    }

    #[test]
    fn buffers_start_on_a_64_byte_boundary_zeroed() {
        check(1.5f32);
        check(f16::ONE);
        check(bf16::ONE);
    }

    #[test]
    fn empty_buffers_allocate_nothing() {
        let b = AlignedBuf::<f32>::try_zeroed(0).expect("empty");
        assert!(b.is_empty());
        let d = AlignedBuf::<f32>::default();
        assert!(d.is_empty());
    }

    #[test]
    fn impossible_sizes_are_none() {
        assert!(AlignedBuf::<f32>::try_zeroed(usize::MAX / 2).is_none(), "the size overflows");
        assert!(AlignedBuf::<f32>::try_zeroed(isize::MAX as usize / 4).is_none(), "past isize::MAX bytes");
        // Representable, but more than any machine has.
        assert!(AlignedBuf::<f32>::try_zeroed(1 << 60).is_none());
    }
}

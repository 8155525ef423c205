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
//!
//! On Linux, blocks of at least [`HUGE_MIN`] bytes are also advised as candidates for
//! transparent huge pages (`madvise(MADV_HUGEPAGE)` on the 2 MiB-aligned part of the block),
//! before their pages are first touched. Where the kernel's THP mode is `madvise` (the common
//! default, this machine's) memory is otherwise mapped in 4 KiB pages, and a kernel streaming a
//! weight of hundreds of MiB walks the page tables every 4 KiB: a two-thread read of 180 MB
//! took 30–32 GB/s in 4 KiB pages and 35–36.5 GB/s in 2 MiB ones (same process, alternated,
//! three rounds of 15). The matmuls streaming a weight from memory, the same weight in each
//! kind of page, alternated call by call (medians of 40, three runs, 2 threads): M = 1 rows
//! (4096², 11008 × 4096, 4096 × 11008; `[K, N]`, `[N, K]`, packed) 0.90–0.99 of the time,
//! M = 16 0.94–1.01. Where THP is off or unsupported the advice changes nothing.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fmt;
use std::ptr::NonNull;

/// The alignment of the first element: a cache line, one AVX-512 vector.
pub(crate) const ALIGN: usize = 64;

/// Blocks of at least this many bytes are advised for transparent huge pages (Linux).
const HUGE_MIN: usize = 4 << 20;

/// The huge-page size the advice aligns to (x86-64's; a multiple of every base page size).
const HUGE_PAGE: usize = 2 << 20;

/// Advises the 2 MiB-aligned part of `bytes` bytes at `block` for transparent huge pages.
/// Advice only: the contents and the allocation are unchanged, and a failure (no THP in the
/// kernel) is ignored.
#[cfg(target_os = "linux")]
fn advise_huge(block: *mut u8, bytes: usize) {
    let start = block.addr().next_multiple_of(HUGE_PAGE);
    let end = (block.addr() + bytes) & !(HUGE_PAGE - 1);
    if end > start {
        // SAFETY: `start..end` lies inside the caller's live allocation and is page-aligned;
        // MADV_HUGEPAGE changes only how the kernel backs those pages, never their contents.
        unsafe { libc::madvise(block.with_addr(start).cast(), end - start, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_block: *mut u8, _bytes: usize) {}

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
        if layout.size() >= HUGE_MIN {
            advise_huge(block.as_ptr(), layout.size());
        }
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

    /// The `VmFlags` of the mapping holding `addr`, from `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn vm_flags(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        // A mapping's first line starts with its range, `lo-hi` in hex; its fields follow.
        for line in smaps.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            let parsed =
                range.and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)));
            if let Some((lo, hi)) = parsed {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some(flags.trim().to_string());
            }
        }
        None
    }

    /// Whether advice given directly shows in `VmFlags` here: a fresh anonymous mapping of
    /// 8 MiB, its aligned middle advised with `madvise` itself. (A sandboxed kernel may accept
    /// the call and record nothing; then the allocator's advice cannot be seen either.)
    #[cfg(target_os = "linux")]
    fn advice_is_recorded() -> bool {
        let bytes = 4 * HUGE_PAGE;
        // SAFETY: a private anonymous mapping, advised, read back through smaps and unmapped;
        // nothing else refers to it.
        unsafe {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            let map = libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
            if map == libc::MAP_FAILED {
                return false;
            }
            let start = map.addr().next_multiple_of(HUGE_PAGE);
            let ok = libc::madvise(map.with_addr(start), HUGE_PAGE, libc::MADV_HUGEPAGE) == 0
                && vm_flags(start).is_some_and(|f| f.split_whitespace().any(|f| f == "hg"));
            libc::munmap(map, bytes);
            ok
        }
    }

    #[test]
    fn large_buffers_are_zeroed_and_advised_for_huge_pages() {
        let len = 3 * HUGE_PAGE / 4 + 5; // 6 MiB + 20 bytes of f32: past HUGE_MIN.
        let mut b = AlignedBuf::<f32>::try_zeroed(len).expect("a 6 MiB allocation");
        assert_eq!(b.as_ptr().addr() % ALIGN, 0);
        assert!(b.iter().all(|&v| v == 0.0), "zeroed");
        b.fill(2.5);
        assert!(b.iter().all(|&v| v == 2.5));
        #[cfg(target_os = "linux")]
        {
            if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
                println!("SKIP the huge-page advice check: this kernel has no transparent huge pages");
                return;
            }
            // The first 2 MiB boundary inside the elements lies in the advised range. (Small
            // buffers are not checked: the allocator may place one where an earlier test's
            // large block was advised and then freed.)
            let inner = b.as_ptr().addr().next_multiple_of(HUGE_PAGE);
            let Some(flags) = vm_flags(inner) else {
                println!("SKIP the huge-page advice check: /proc/self/smaps shows no VmFlags for the buffer");
                return;
            };
            if !flags.split_whitespace().any(|f| f == "hg") && !advice_is_recorded() {
                println!("SKIP the huge-page advice check: this kernel does not record MADV_HUGEPAGE in VmFlags");
                return;
            }
            assert!(flags.split_whitespace().any(|f| f == "hg"), "VmFlags {flags}: no MADV_HUGEPAGE");
        }
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

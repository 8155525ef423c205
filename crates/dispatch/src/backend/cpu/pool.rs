//! Splitting one op's work across the calling thread and rayon's pool.
//!
//! A rayon parallel iterator started from a thread outside the pool (an engine's thread, the
//! bench's) hands the whole job to the pool and puts the caller to sleep until it is done: two
//! cross-thread wake-ups per op. On a small op they cost as much as the op (measured: a third
//! of a 14 × 14 depthwise layer's time, in the kernel's scheduler). [`for_each_chunk_mut`]
//! instead starts on the calling thread at once: it posts one helper job per other pool
//! thread, and the caller and the helpers take chunks from a shared counter. A helper that
//! wakes late finds the counter past the end and leaves without touching the data, so the
//! caller waits only for chunks already taken, spinning briefly (they are being worked on),
//! never for a thread to wake.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The work shared by the caller and its helpers.
struct Shared {
    /// The next chunk to take (past `count` once all are taken or the rest abandoned).
    next: AtomicUsize,
    /// Chunks finished, or abandoned after a panic; the call returns when it reaches `count`.
    done: AtomicUsize,
    count: usize,
    /// The chunk function, its lifetime erased: only called for a chunk taken from `next`
    /// below `count`, and the caller does not return before every such chunk is `done`.
    f: *const (dyn Fn(usize) + Sync + 'static),
    /// The first panic of a chunk, raised again on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `f` points to a `Sync` closure, called from several threads only as described at
// the field; the rest is atomics and a mutex.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// Takes chunks until none are left. After a panic in one, the chunks not yet taken are
    /// abandoned (counted done without running) and the panic is kept for the caller.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.count {
                return;
            }
            // SAFETY: chunk i < count was taken, so the caller is still waiting (see `f`).
            let run = catch_unwind(AssertUnwindSafe(|| unsafe { (*self.f)(i) }));
            self.done.fetch_add(1, Ordering::Release);
            if let Err(panic) = run {
                self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(panic);
                self.close();
                return;
            }
        }
    }

    /// No chunk is taken after this; the ones never taken count as done.
    fn close(&self) {
        let prev = self.next.fetch_max(self.count, Ordering::Relaxed);
        if prev < self.count {
            self.done.fetch_add(self.count - prev, Ordering::Release);
        }
    }
}

/// Runs `f(i)` for every `i < count`, on the calling thread and on up to `threads − 1` of
/// rayon's pool threads. Inside the pool (a nested call) it is rayon's own split. A panic in
/// `f` is raised on the caller once no chunk is running any more.
pub(super) fn for_each_index(count: usize, f: &(dyn Fn(usize) + Sync)) {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads().min(count);
    if threads <= 1 {
        (0..count).for_each(f);
        return;
    }
    if rayon::current_thread_index().is_some() {
        (0..count).into_par_iter().for_each(f);
        return;
    }
    // SAFETY: only the lifetime is erased; see `Shared::f` for why no call outlives it.
    let f: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
    let shared =
        Arc::new(Shared { next: AtomicUsize::new(0), done: AtomicUsize::new(0), count, f, panic: Mutex::new(None) });
    for _ in 1..threads {
        let s = Arc::clone(&shared);
        rayon::spawn(move || s.work());
    }
    shared.work();
    // Every chunk is taken or abandoned now; wait for the ones still running elsewhere
    // (being worked on, so a short spin, then yielding).
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < count {
        if spins < 1 << 14 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
    if let Some(panic) = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
        resume_unwind(panic);
    }
}

/// A raw pointer to the chunks of one call (see the SAFETY note at its use).
struct Chunks<T>(*mut T);
// SAFETY: each chunk is handed to exactly one call of the chunk function.
unsafe impl<T: Send> Sync for Chunks<T> {}

/// `f(i, chunk)` for each `chunk`-long piece of `data` (the last one shorter), split as
/// [`for_each_index`] does.
pub(super) fn for_each_chunk_mut<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunk = chunk.max(1);
    let (len, count) = (data.len(), data.len().div_ceil(chunk));
    let base = Chunks(data.as_mut_ptr());
    for_each_index(count, &|i| {
        let base = &base;
        let start = i * chunk;
        let n = chunk.min(len - start);
        // SAFETY: `data` is exclusively borrowed for the whole call; chunk i is
        // start..start + n inside it, and `for_each_index` calls each i exactly once, so the
        // slices never overlap.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), n) };
        f(i, piece);
    });
}

/// [`for_each_chunk_mut`] for a fallible `f`: the first error is returned (chunks after it
/// may or may not run).
pub(super) fn try_for_each_chunk_mut<T: Send, Er: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> Result<(), Er> + Sync,
) -> Result<(), Er> {
    let first = FirstError::new();
    for_each_chunk_mut(data, chunk, |i, piece| first.run(|| f(i, piece)));
    first.into_result()
}

/// [`for_each_index`] for a fallible `f`: the first error is returned (indices after it may
/// or may not run).
pub(super) fn try_for_each_index<Er: Send>(count: usize, f: impl Fn(usize) -> Result<(), Er> + Sync) -> Result<(), Er> {
    let first = FirstError::new();
    for_each_index(count, &|i| first.run(|| f(i)));
    first.into_result()
}

/// The first error of a parallel loop; once there is one, the remaining steps are skipped.
struct FirstError<Er> {
    first: Mutex<Option<Er>>,
    failed: std::sync::atomic::AtomicBool,
}

impl<Er> FirstError<Er> {
    fn new() -> Self {
        FirstError { first: Mutex::new(None), failed: std::sync::atomic::AtomicBool::new(false) }
    }

    fn run(&self, step: impl FnOnce() -> Result<(), Er>) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = step() {
            self.failed.store(true, Ordering::Relaxed);
            self.first.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        }
    }

    fn into_result(self) -> Result<(), Er> {
        match self.first.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk once, from the calling thread (shared with the pool) and from inside the
    /// pool (rayon's split), for counts around the thread count.
    #[test]
    fn every_chunk_exactly_once() {
        for len in [0, 1, 2, 3, 7, 64, 1000, 4099] {
            for chunk in [1, 2, 5, 64, 5000] {
                let mut data = vec![0u32; len];
                for_each_chunk_mut(&mut data, chunk, |i, piece| {
                    assert!(piece.len() <= chunk && !piece.is_empty());
                    for (j, v) in piece.iter_mut().enumerate() {
                        *v += (i * chunk + j) as u32 + 1;
                    }
                });
                assert!(data.iter().enumerate().all(|(j, &v)| v == j as u32 + 1), "len {len} chunk {chunk}");
                let mut nested = vec![0u32; len];
                rayon::scope(|_| {
                    for_each_chunk_mut(&mut nested, chunk, |_, piece| piece.iter_mut().for_each(|v| *v += 1));
                });
                assert!(nested.iter().all(|&v| v == 1), "nested: len {len} chunk {chunk}");
            }
        }
    }

    /// A panic in a chunk reaches the caller, after every chunk that started has finished
    /// (no helper is left writing into the caller's data).
    #[test]
    fn a_panicking_chunk_reaches_the_caller() {
        let started = AtomicUsize::new(0);
        let finished = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            for_each_index(64, &|i| {
                started.fetch_add(1, Ordering::SeqCst);
                if i == 3 {
                    panic!("chunk 3");
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
                finished.fetch_add(1, Ordering::SeqCst);
            })
        }));
        assert!(result.is_err(), "the panic was lost");
        assert_eq!(started.load(Ordering::SeqCst), finished.load(Ordering::SeqCst) + 1, "a chunk outlived the call");
    }
}

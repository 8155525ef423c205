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
//!
//! A helper that runs out of chunks lingers for [`LINGER`] before it goes back to the pool
//! (where rayon puts an idle thread to sleep): it marks its slot in [`SLOTS`] free and spins,
//! running any other job the pool has meanwhile (`rayon::yield_now`), and the next call hands
//! it its work through that slot instead of waking a thread. Ops come back to back in a
//! network, so most calls find their helpers still there: MobileNetV2 at 224² on 2 threads
//! (2-core AVX-512 Xeon, in-process A/B, lingering on and off alternated run by run, medians of
//! 30, three runs each) took 0.95–0.96 of the time in both layouts with 100 µs of lingering,
//! 0.95–0.97 with 50, 200 or 1,000; one op repeated back to back (ReLU over 2^16–2^20
//! elements, matmuls from 64³ to 16 × 4096 × 4096) stayed level (0.98–1.01; 64³ 0.90), rayon's
//! own brief spinning already keeping its thread awake there. The price is a core spinning up
//! to [`LINGER`] after each parallel op.

use std::any::Any;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
            // A panic is kept before its chunk counts as done: the caller may return as soon
            // as every chunk is, and must find it.
            if let Err(panic) = run {
                self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(panic);
                self.done.fetch_add(1, Ordering::Release);
                self.close();
                return;
            }
            self.done.fetch_add(1, Ordering::Release);
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
    // Helpers still lingering from an earlier call take the work at once; the rest are new
    // pool jobs.
    let mut helpers = 1;
    for slot in &SLOTS {
        if helpers == threads {
            break;
        }
        if post(slot, &shared) {
            helpers += 1;
        }
    }
    for _ in helpers..threads {
        let s = Arc::clone(&shared);
        rayon::spawn(move || help(s));
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

/// How long a helper out of chunks waits for the next call's work before it returns to the pool.
const LINGER: Duration = Duration::from_micros(100);

/// A slot's state when its helper is not lingering (never dereferenced).
const GONE: *mut Shared = std::ptr::dangling_mut();

/// One slot per pool thread (by `rayon::current_thread_index`; threads past the 64th do not
/// linger): null while its helper lingers, free for a caller to post work into; a posted
/// call's `Arc<Shared>` (from `Arc::into_raw`, owned by the slot until the helper takes it);
/// or [`GONE`]. Only the slot's own thread turns a posted call or null into `GONE`; callers
/// only turn null into a posted call.
static SLOTS: [AtomicPtr<Shared>; 64] = [const { AtomicPtr::new(GONE) }; 64];

/// Hands `shared` to the helper lingering in `slot`, if one is (the slot is null).
fn post(slot: &AtomicPtr<Shared>, shared: &Arc<Shared>) -> bool {
    let raw = Arc::into_raw(Arc::clone(shared)).cast_mut();
    if slot.compare_exchange(std::ptr::null_mut(), raw, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
        return true;
    }
    // SAFETY: `raw` is the `into_raw` just above, not handed over.
    drop(unsafe { Arc::from_raw(raw) });
    false
}

/// A helper's pool job: works on `first`, then lingers in its thread's slot for the next
/// call's work, again and again, until [`LINGER`] passes without any.
fn help(first: Arc<Shared>) {
    thread_local! {
        /// Whether a helper is running further down this thread's stack.
        static HELPING: Cell<bool> = const { Cell::new(false) };
    }
    let slot = rayon::current_thread_index().and_then(|i| SLOTS.get(i));
    // A helper run by another's `yield_now` (or by work stealing inside a chunk) only works:
    // the one below it owns the slot, and lingering in turn would nest without bound.
    let (Some(slot), false) = (slot, HELPING.get()) else {
        first.work();
        return;
    };
    /// Leaving (or unwinding from a foreign job run by `yield_now`): the thread's slot closed,
    /// a call posted to it meanwhile given back (its caller does its chunks itself).
    struct Leave<'s>(&'s AtomicPtr<Shared>);
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            let p = self.0.swap(GONE, Ordering::AcqRel);
            if !p.is_null() && p != GONE {
                // SAFETY: a posted call (see the loop below), never taken.
                drop(unsafe { Arc::from_raw(p) });
            }
            HELPING.set(false);
        }
    }
    HELPING.set(true);
    let _leave = Leave(slot);
    let mut job = first;
    loop {
        job.work();
        drop(job);
        slot.store(std::ptr::null_mut(), Ordering::Release);
        let start = Instant::now();
        job = loop {
            // A posted call, or the time is up: close the slot, taking what it holds (a call
            // posted up to the last moment is taken, not lost; callers never change a
            // non-null slot).
            if !slot.load(Ordering::Acquire).is_null() || start.elapsed() > LINGER {
                let p = slot.swap(GONE, Ordering::AcqRel);
                if p.is_null() {
                    return;
                }
                // SAFETY: a caller stored `Arc::into_raw` of its own clone here and gave it
                // up; only this thread takes it out.
                break unsafe { Arc::from_raw(p) };
            }
            // Other work of the pool (a `gemm` split, an engine's jobs) runs here meanwhile.
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::hint::spin_loop();
            }
        };
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

    /// Callers on several threads at once, back to back (so each finds helpers lingering, or
    /// not, or taken by another caller): every index of every call runs exactly once.
    #[test]
    fn concurrent_callers_hand_work_to_lingering_helpers_once() {
        std::thread::scope(|scope| {
            for t in 0..4usize {
                scope.spawn(move || {
                    for call in 0..3000usize {
                        let count = 1 + (call + t) % 9;
                        let hits: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
                        for_each_index(count, &|i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "thread {t} call {call}");
                        if call % 500 == 0 {
                            // Past the lingering time: the helpers have gone back to the pool.
                            std::thread::sleep(2 * LINGER);
                        }
                    }
                });
            }
        });
        // A call posted to a slot is taken by its helper, never left there: each one still in
        // a slot now is gone within seconds. (Not at once: a helper running another job from
        // its `yield_now`, or preempted on a loaded machine, takes it when that ends; other
        // tests of this binary post calls of their own meanwhile, hence one pointer at a time.
        // An H200 machine's 16 cores running all the test binaries at once showed the first.)
        std::thread::sleep(4 * LINGER);
        let posted: Vec<(usize, *mut Shared)> = SLOTS
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.load(Ordering::Acquire)))
            .filter(|&(_, p)| !p.is_null() && p != GONE)
            .collect();
        let start = Instant::now();
        for (i, p) in posted {
            while SLOTS[i].load(Ordering::Acquire) == p {
                assert!(start.elapsed().as_secs() < 10, "a call was left in slot {i}");
                std::thread::sleep(LINGER);
            }
        }
    }

    /// A helper lingering after a call takes work posted to its slot, with the poster doing
    /// none of it.
    #[test]
    fn a_lingering_helper_takes_posted_work() {
        static RAN_ON: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);
        fn record(_: usize) {
            *RAN_ON.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current().id());
        }
        let f: &'static (dyn Fn(usize) + Sync) = &record;
        // Tried for a while, not a number of times: with the other tests of the binary (and
        // other processes) busy on the two cores, the helper may not be scheduled within a
        // call's wait for many calls in a row (1,000 calls were once not enough under load).
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            for_each_index(2, &|_| {});
            // The helper lingers once it has been scheduled and found no chunk left.
            let start = Instant::now();
            let slot = loop {
                match SLOTS.iter().find(|s| s.load(Ordering::Acquire).is_null()) {
                    Some(slot) => break Some(slot),
                    None if start.elapsed() < 20 * LINGER => std::hint::spin_loop(),
                    None => break None,
                }
            };
            let Some(slot) = slot else { continue };
            let shared = Arc::new(Shared {
                next: AtomicUsize::new(0),
                done: AtomicUsize::new(0),
                count: 1,
                f,
                panic: Mutex::new(None),
            });
            if !post(slot, &shared) {
                continue; // it stopped lingering just now
            }
            let start = Instant::now();
            while shared.done.load(Ordering::Acquire) < 1 {
                assert!(start.elapsed().as_secs() < 10, "the lingering helper never took the posted work");
                std::thread::yield_now();
            }
            assert_ne!(*RAN_ON.lock().unwrap_or_else(|e| e.into_inner()), Some(std::thread::current().id()));
            return;
        }
        panic!("no helper was found lingering in 60 s of calls");
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

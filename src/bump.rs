//! The allocator of the two static binaries (`nvidia-container-runtime` and
//! `nvidia-container-runtime-hook`): a bump allocator.
//!
//! Both live a few milliseconds and end in `exec` or `exit`, so freeing memory one
//! block at a time is wasted work. musl's allocator (the binaries are built for musl
//! when the target is installed; its start-up is about 0.5 ms cheaper than static
//! glibc's on a VM, where glibc's CPU feature probing traps to the hypervisor) maps
//! and unmaps pages as blocks come and go: about 0.9 ms of system time on an 8-GPU
//! create. Here, memory comes from the system allocator in 1 MiB chunks and is handed
//! out in order; `dealloc` takes back only the most recent block, and `realloc` of the
//! most recent block grows it in place, which is what a growing `Vec` or `String`
//! does. Blocks of 256 KiB or more go to the system allocator and are freed.
//!
//! The binaries' memory grows with their inputs (config.json, config.toml, the OCI
//! state), as it would with any allocator; a `Vec` that keeps doubling while other
//! blocks are taken leaves its earlier sizes behind, which at most doubles it, so the
//! peak stays within a small multiple of what the system allocator would have used.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// The size of each chunk taken from the system allocator.
const CHUNK: usize = 1 << 20;
/// Blocks this large or larger go straight to the system allocator.
const LARGE: usize = CHUNK / 4;

/// A bump allocator; see the module docs. `#[global_allocator] static A: Bump =
/// Bump::new();` in a binary's main.
pub struct Bump {
    lock: AtomicBool,
    state: UnsafeCell<State>,
}

struct State {
    /// The next free byte of the current chunk, and the chunk's end (0, 0: none yet).
    next: usize,
    end: usize,
}

// SAFETY: `state` is only touched while `lock` is held (see `Bump::with`).
unsafe impl Sync for Bump {}

impl Bump {
    pub const fn new() -> Bump {
        Bump {
            lock: AtomicBool::new(false),
            state: UnsafeCell::new(State { next: 0, end: 0 }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held, so no other reference to the state exists.
        let out = f(unsafe { &mut *self.state.get() });
        self.lock.store(false, Ordering::Release);
        out
    }
}

impl Default for Bump {
    fn default() -> Bump {
        Bump::new()
    }
}

fn small(layout: Layout) -> bool {
    layout.size() < LARGE && layout.align() <= 4096
}

impl State {
    /// A block of `layout` from the current chunk, or from a new one.
    fn take(&mut self, layout: Layout) -> *mut u8 {
        let size = layout.size().max(1);
        let align = layout.align();
        let start = self.next.next_multiple_of(align);
        if self.end != 0 && start + size <= self.end {
            self.next = start + size;
            return start as *mut u8;
        }
        let Ok(chunk) = Layout::from_size_align(CHUNK, 4096) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `chunk` has a non-zero size. Chunks are never freed.
        let base = unsafe { System.alloc(chunk) };
        if base.is_null() {
            return base;
        }
        // `size < LARGE` and `align <= 4096`, so the block fits the new chunk at its
        // start (4096-aligned).
        self.next = base as usize + size;
        self.end = base as usize + CHUNK;
        base
    }
}

// SAFETY: blocks handed out never overlap (the bump pointer only moves past them, and
// moves back only over the most recent block when it is freed or resized); each is
// aligned as asked; large blocks and their frees go to `System` alike, decided by
// the layout, which `dealloc` and `realloc` get unchanged from `alloc`.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !small(layout) {
            // SAFETY: forwarded with the caller's layout.
            return unsafe { System.alloc(layout) };
        }
        self.with(|s| s.take(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !small(layout) {
            // SAFETY: this block came from `System` with this layout.
            return unsafe { System.dealloc(ptr, layout) };
        }
        self.with(|s| {
            if ptr as usize + layout.size().max(1) == s.next {
                s.next = ptr as usize;
            }
        });
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        match (small(layout), small(new_layout)) {
            // SAFETY: both from and to `System`, with the caller's layout.
            (false, false) => return unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                let in_place = self.with(|s| {
                    let old_end = ptr as usize + layout.size().max(1);
                    let new_end = ptr as usize + new_size.max(1);
                    if old_end == s.next && new_end <= s.end {
                        // The most recent block: grows or shrinks where it is.
                        s.next = new_end;
                        true
                    } else {
                        // An older block can shrink where it is; the tail is lost.
                        new_size <= layout.size()
                    }
                });
                if in_place {
                    return ptr;
                }
            }
            _ => {}
        }
        // SAFETY: the new layout is valid (checked above) and has a non-zero size
        // for any caller that upholds `realloc`'s contract.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct and at least this long.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn blocks_are_aligned_and_disjoint() {
        let a = Bump::new();
        let mut blocks = Vec::new();
        for i in 1..2000usize {
            let l = layout(i % 700 + 1, 1 << (i % 7));
            let p = unsafe { a.alloc(l) };
            assert!(!p.is_null());
            assert_eq!(p as usize % l.align(), 0);
            unsafe { std::ptr::write_bytes(p, (i % 251) as u8, l.size()) };
            blocks.push((p, l, (i % 251) as u8));
        }
        // Every block still holds its own fill byte: none overlapped another.
        for (p, l, fill) in &blocks {
            let s = unsafe { std::slice::from_raw_parts(*p, l.size()) };
            assert!(s.iter().all(|b| b == fill));
        }
    }

    #[test]
    fn the_last_block_grows_in_place_and_is_taken_back() {
        let a = Bump::new();
        let l = layout(16, 8);
        let p = unsafe { a.alloc(l) };
        unsafe { p.write(7) };
        let q = unsafe { a.realloc(p, l, 64) };
        assert_eq!(p, q, "the most recent block grows in place");
        assert_eq!(unsafe { q.read() }, 7);
        unsafe { a.dealloc(q, layout(64, 8)) };
        let r = unsafe { a.alloc(l) };
        assert_eq!(r, p, "freeing the most recent block gives its memory back");
    }

    #[test]
    fn an_older_block_moves_when_it_grows() {
        let a = Bump::new();
        let l = layout(32, 8);
        let p = unsafe { a.alloc(l) };
        unsafe { std::ptr::write_bytes(p, 9, 32) };
        let _later = unsafe { a.alloc(l) };
        let q = unsafe { a.realloc(p, l, 100) };
        assert_ne!(p, q);
        assert!(
            unsafe { std::slice::from_raw_parts(q, 32) }
                .iter()
                .all(|b| *b == 9)
        );
    }

    #[test]
    fn large_blocks_and_crossings_keep_their_bytes() {
        let a = Bump::new();
        let l = layout(1000, 8);
        let p = unsafe { a.alloc(l) };
        unsafe { std::ptr::write_bytes(p, 3, 1000) };
        // small → large → larger → small: each step keeps the common prefix.
        let big = unsafe { a.realloc(p, l, LARGE + 10) };
        assert!(
            unsafe { std::slice::from_raw_parts(big, 1000) }
                .iter()
                .all(|b| *b == 3)
        );
        let bigger = unsafe { a.realloc(big, layout(LARGE + 10, 8), 3 * CHUNK) };
        assert!(
            unsafe { std::slice::from_raw_parts(bigger, 1000) }
                .iter()
                .all(|b| *b == 3)
        );
        let back = unsafe { a.realloc(bigger, layout(3 * CHUNK, 8), 500) };
        assert!(
            unsafe { std::slice::from_raw_parts(back, 500) }
                .iter()
                .all(|b| *b == 3)
        );
        unsafe { a.dealloc(back, layout(500, 8)) };
    }

    #[test]
    fn chunks_are_refilled() {
        let a = Bump::new();
        let l = layout(LARGE - 1, 16);
        let ptrs: Vec<_> = (0..20).map(|_| unsafe { a.alloc(l) }).collect();
        assert!(ptrs.iter().all(|p| !p.is_null()));
        let mut sorted: Vec<usize> = ptrs.iter().map(|p| *p as usize).collect();
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|w| w[1] - w[0] >= l.size()));
    }
}

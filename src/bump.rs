//! The allocator of the two static binaries (`nvidia-container-runtime` and
//! `nvidia-container-runtime-hook`): a bump allocator with size-class free lists.
//!
//! Both live a few milliseconds and end in `exec` or `exit`, so returning memory to
//! the system is wasted work. musl's allocator (the binaries are built for musl when
//! the target is installed; its start-up is about 0.5 ms cheaper than static glibc's
//! on a VM, where glibc's CPU feature probing traps to the hypervisor) maps and unmaps
//! pages as blocks come and go: about 0.9 ms of system time on an 8-GPU create.
//!
//! Here, memory comes from the system allocator in 1 MiB chunks and is handed out in
//! order. Every size is rounded up to a size class (multiples of 16 up to 128 bytes,
//! then four classes per power of two), and a freed block goes on its class's free
//! list for the next request of that class, except the most recent block, which gives
//! its memory back to the bump pointer. Reuse matters because every page the process
//! touches for the first time is a page fault: an 8-GPU create frees about half of the
//! ~300 KB it allocates, and without reuse that half was fresh pages. `realloc` of the
//! most recent block grows it in place, which is what a growing `Vec` or `String`
//! does, and a block that stays in its class never moves. Blocks of 256 KiB or more go
//! to the system allocator and are freed.
//!
//! Peak memory is at most what the live blocks need plus the rounding (under 25%) and
//! blocks parked on the lists of other classes, a small multiple of what the system
//! allocator would use.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// The size of each chunk taken from the system allocator.
const CHUNK: usize = 1 << 20;
/// Blocks this large or larger go straight to the system allocator.
const LARGE: usize = CHUNK / 4;
/// Every small block's address and size are multiples of this.
const GRAIN: usize = 16;
/// Size classes below `LARGE`: 8 of 16..=128 bytes, then 4 per power of two up to
/// 2^18 (the largest small size, `LARGE - 1`, has exponent 17).
const CLASSES: usize = 8 + 4 * (18 - 7);

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
    /// Per size class, the most recently freed block (0: none). Each free block holds
    /// the address of the next one in its first word.
    free: [usize; CLASSES],
}

// SAFETY: `state` is only touched while `lock` is held (see `Bump::with`).
unsafe impl Sync for Bump {}

impl Bump {
    pub const fn new() -> Bump {
        Bump {
            lock: AtomicBool::new(false),
            state: UnsafeCell::new(State {
                next: 0,
                end: 0,
                free: [0; CLASSES],
            }),
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

/// The size class of a small block of `size` bytes: its index and its rounded size.
fn class(size: usize) -> (usize, usize) {
    let size = size.max(1);
    if size <= 128 {
        let rounded = size.next_multiple_of(GRAIN);
        return (rounded / GRAIN - 1, rounded);
    }
    // size is in (2^exp, 2^(exp+1)], exp >= 7: four steps of 2^(exp-2) each.
    let exp = (usize::BITS - 1 - (size - 1).leading_zeros()) as usize;
    let step = 1usize << (exp - 2);
    let rounded = size.next_multiple_of(step);
    (8 + (exp - 7) * 4 + (rounded / step - 5), rounded)
}

impl State {
    /// A block of `layout` (small): from its class's free list, or bumped from the
    /// current chunk or a new one.
    fn take(&mut self, layout: Layout) -> *mut u8 {
        let (index, size) = class(layout.size());
        let align = layout.align().max(GRAIN);
        let head = self.free[index];
        if head != 0 && head.is_multiple_of(align) {
            // SAFETY: `head` is a free block of this class (see `give`); its first word
            // holds the next free block.
            self.free[index] = unsafe { (head as *const usize).read() };
            return head as *mut u8;
        }
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
        // `size <= LARGE` and `align <= 4096`, so the block fits the new chunk at its
        // start (4096-aligned). The rest of the old chunk is left unused.
        self.next = base as usize + size;
        self.end = base as usize + CHUNK;
        base
    }

    /// Takes back the small block at `ptr`, of `size` bytes as asked for.
    fn give(&mut self, ptr: *mut u8, size: usize) {
        let (index, size) = class(size);
        let at = ptr as usize;
        if at + size == self.next {
            self.next = at;
        } else {
            // SAFETY: the block is at least GRAIN bytes and GRAIN-aligned, so it holds
            // one aligned word; the caller no longer uses it.
            unsafe { (ptr as *mut usize).write(self.free[index]) };
            self.free[index] = at;
        }
    }
}

// SAFETY: blocks handed out never overlap: the bump pointer only moves past them, and
// moves back only over the most recent block when it is freed or resized; a block on a
// free list was freed by its owner and is handed to one new owner. Each block is
// aligned as asked (a listed block is reused only when its address suits the request).
// A block's class is decided by the size in the layout, which `dealloc` and `realloc`
// get unchanged from `alloc`, and a block is never smaller than its class's size.
// Large blocks and their frees go to `System` alike, decided by the layout.
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
        self.with(|s| s.give(ptr, layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if small(layout) && small(new_layout) {
            let (old_index, old_class) = class(layout.size());
            let (new_index, new_class) = class(new_size);
            // The same class: the block already has room.
            if old_index == new_index {
                return ptr;
            }
            let in_place = self.with(|s| {
                if ptr as usize + old_class == s.next && ptr as usize + new_class <= s.end {
                    // The most recent block: grows or shrinks where it is.
                    s.next = ptr as usize + new_class;
                    true
                } else {
                    false
                }
            });
            if in_place {
                return ptr;
            }
        } else if !small(layout) && !small(new_layout) {
            // SAFETY: both from and to `System`, with the caller's layout.
            return unsafe { System.realloc(ptr, layout, new_size) };
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
            // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
            let p = unsafe { a.alloc(l) };
            assert!(!p.is_null());
            assert_eq!(p as usize % l.align(), 0);
            // SAFETY: the block was just allocated with at least that many bytes, and only this test uses it.
            unsafe { std::ptr::write_bytes(p, (i % 251) as u8, l.size()) };
            blocks.push((p, l, (i % 251) as u8));
        }
        // Every block still holds its own fill byte: none overlapped another.
        for (p, l, fill) in &blocks {
            // SAFETY: the block holds at least that many bytes, written above, and nothing writes them meanwhile.
            let s = unsafe { std::slice::from_raw_parts(*p, l.size()) };
            assert!(s.iter().all(|b| b == fill));
        }
    }

    #[test]
    fn the_last_block_grows_in_place_and_is_taken_back() {
        let a = Bump::new();
        let l = layout(16, 8);
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let p = unsafe { a.alloc(l) };
        // SAFETY: the block was just allocated with at least that many bytes, and only this test uses it.
        unsafe { p.write(7) };
        // SAFETY: the block came from this allocator with that layout; the new size is non-zero.
        let q = unsafe { a.realloc(p, l, 64) };
        assert_eq!(p, q, "the most recent block grows in place");
        // SAFETY: the block holds at least that many bytes, written above, and nothing writes them meanwhile.
        assert_eq!(unsafe { q.read() }, 7);
        // SAFETY: the block came from this allocator with that layout and is not used again.
        unsafe { a.dealloc(q, layout(64, 8)) };
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let r = unsafe { a.alloc(l) };
        assert_eq!(r, p, "freeing the most recent block gives its memory back");
    }

    #[test]
    fn size_classes_cover_every_small_size_in_order() {
        let mut last = class(1);
        assert_eq!(last, (0, GRAIN));
        for size in 2..LARGE {
            let (index, rounded) = class(size);
            assert!(
                rounded >= size && rounded % GRAIN == 0,
                "size {size}: {rounded}"
            );
            assert!(index < CLASSES, "size {size}: class {index}");
            // At most a quarter (or 15 bytes) more than asked.
            assert!(
                rounded - size <= (size / 4).max(GRAIN - 1),
                "size {size}: {rounded}"
            );
            if index == last.0 {
                assert_eq!(rounded, last.1, "size {size}");
            } else {
                assert_eq!(index, last.0 + 1, "size {size}: classes are contiguous");
                assert!(rounded > last.1);
            }
            last = (index, rounded);
        }
        assert_eq!(last.0, CLASSES - 1);
    }

    #[test]
    fn a_freed_block_is_reused_by_its_class_only() {
        let a = Bump::new();
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let p = unsafe { a.alloc(layout(200, 8)) };
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let _keep = unsafe { a.alloc(layout(8, 8)) };
        // SAFETY: the block came from this allocator with that layout and is not used again.
        unsafe { a.dealloc(p, layout(200, 8)) };
        // Another class bumps; the same class (224 bytes: 193..=224) takes it back.
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let other = unsafe { a.alloc(layout(40, 8)) };
        assert_ne!(other, p);
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let same = unsafe { a.alloc(layout(220, 8)) };
        assert_eq!(same, p);
        // SAFETY: the block was just allocated with at least that many bytes, and only this test uses it.
        unsafe { std::ptr::write_bytes(same, 1, 220) };
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let next = unsafe { a.alloc(layout(220, 8)) };
        assert_ne!(next, p, "taken off the list once");
    }

    #[test]
    fn a_listed_block_is_reused_only_when_aligned_enough() {
        let a = Bump::new();
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let _pad = unsafe { a.alloc(layout(16, 16)) };
        // 16-aligned but not 64-aligned (the chunk starts 4096-aligned).
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let p = unsafe { a.alloc(layout(64, 16)) };
        assert_eq!(p as usize % 64, 16);
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let _keep = unsafe { a.alloc(layout(8, 8)) };
        // SAFETY: the block came from this allocator with that layout and is not used again.
        unsafe { a.dealloc(p, layout(64, 16)) };
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let q = unsafe { a.alloc(layout(64, 64)) };
        assert_eq!(q as usize % 64, 0);
        assert_ne!(q, p);
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        assert_eq!(unsafe { a.alloc(layout(64, 8)) }, p);
    }

    #[test]
    fn growing_within_a_class_keeps_the_block() {
        let a = Bump::new();
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let p = unsafe { a.alloc(layout(130, 8)) };
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let _later = unsafe { a.alloc(layout(8, 8)) };
        // 130 and 160 are both in the 129..=160 class.
        // SAFETY: the block came from this allocator with that layout; the new size is non-zero.
        assert_eq!(unsafe { a.realloc(p, layout(130, 8), 160) }, p);
    }

    #[test]
    fn an_older_block_moves_when_it_grows() {
        let a = Bump::new();
        let l = layout(32, 8);
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let p = unsafe { a.alloc(l) };
        // SAFETY: the block was just allocated with at least that many bytes, and only this test uses it.
        unsafe { std::ptr::write_bytes(p, 9, 32) };
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let _later = unsafe { a.alloc(l) };
        // SAFETY: the block came from this allocator with that layout; the new size is non-zero.
        let q = unsafe { a.realloc(p, l, 100) };
        assert_ne!(p, q);
        assert!(
            // SAFETY: the block holds at least that many bytes, written above, and nothing writes them meanwhile.
            unsafe { std::slice::from_raw_parts(q, 32) }
                .iter()
                .all(|b| *b == 9)
        );
    }

    #[test]
    fn large_blocks_and_crossings_keep_their_bytes() {
        let a = Bump::new();
        let l = layout(1000, 8);
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let p = unsafe { a.alloc(l) };
        // SAFETY: the block was just allocated with at least that many bytes, and only this test uses it.
        unsafe { std::ptr::write_bytes(p, 3, 1000) };
        // small → large → larger → small: each step keeps the common prefix.
        // SAFETY: the block came from this allocator with that layout; the new size is non-zero.
        let big = unsafe { a.realloc(p, l, LARGE + 10) };
        assert!(
            // SAFETY: the block holds at least that many bytes, written above, and nothing writes them meanwhile.
            unsafe { std::slice::from_raw_parts(big, 1000) }
                .iter()
                .all(|b| *b == 3)
        );
        // SAFETY: the block came from this allocator with that layout; the new size is non-zero.
        let bigger = unsafe { a.realloc(big, layout(LARGE + 10, 8), 3 * CHUNK) };
        assert!(
            // SAFETY: the block holds at least that many bytes, written above, and nothing writes them meanwhile.
            unsafe { std::slice::from_raw_parts(bigger, 1000) }
                .iter()
                .all(|b| *b == 3)
        );
        // SAFETY: the block came from this allocator with that layout; the new size is non-zero.
        let back = unsafe { a.realloc(bigger, layout(3 * CHUNK, 8), 500) };
        assert!(
            // SAFETY: the block holds at least that many bytes, written above, and nothing writes them meanwhile.
            unsafe { std::slice::from_raw_parts(back, 500) }
                .iter()
                .all(|b| *b == 3)
        );
        // SAFETY: the block came from this allocator with that layout and is not used again.
        unsafe { a.dealloc(back, layout(500, 8)) };
    }

    #[test]
    fn chunks_are_refilled() {
        let a = Bump::new();
        let l = layout(LARGE - 1, 16);
        // SAFETY: the layout has a non-zero size, all `GlobalAlloc::alloc` asks.
        let ptrs: Vec<_> = (0..20).map(|_| unsafe { a.alloc(l) }).collect();
        assert!(ptrs.iter().all(|p| !p.is_null()));
        let mut sorted: Vec<usize> = ptrs.iter().map(|p| *p as usize).collect();
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|w| w[1] - w[0] >= l.size()));
    }
}

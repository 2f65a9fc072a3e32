//! `mentis-enter`: the first program of every user process (docs/ARCHITECTURE.md, "Starting user code").
//!
//! A freestanding binary of about 2 KiB (no std, no libc: system calls only), built by the executor's
//! build script and embedded in the executor, which runs it from a sealed memfd. The logic is in
//! `enter.rs`, which the executor's unit tests also compile.
#![no_std]
#![no_main]
// The memory functions below are loops; LLVM must not turn them back into calls to themselves.
#![no_builtins]

#[path = "enter.rs"]
mod enter;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    enter::sys::exit(enter::EXIT_USAGE)
}

// Without libc, the symbols the compiler may call are ours: memcpy, memmove, memset and memcmp for what it
// lowers to them, and the personality routine the precompiled core refers to (never called: panics abort).

/// # Safety
/// As C's memcpy.
#[unsafe(no_mangle)]
unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: as C's memcpy: both ranges are valid and do not overlap.
    unsafe { memmove(dest, src, n) }
}

/// # Safety
/// As C's memmove.
#[unsafe(no_mangle)]
unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: as C's memmove: both ranges are valid; the copy runs away from the overlap.
    unsafe {
        if dest.cast_const() < src {
            for i in 0..n {
                *dest.add(i) = *src.add(i);
            }
        } else {
            for i in (0..n).rev() {
                *dest.add(i) = *src.add(i);
            }
        }
    }
    dest
}

/// # Safety
/// As C's memset.
#[unsafe(no_mangle)]
unsafe extern "C" fn memset(dest: *mut u8, byte: i32, n: usize) -> *mut u8 {
    // SAFETY: as C's memset: the range is valid. The byte is the low 8 bits, as in C.
    unsafe {
        for i in 0..n {
            *dest.add(i) = byte as u8;
        }
    }
    dest
}

/// # Safety
/// As C's memcmp.
#[unsafe(no_mangle)]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: as C's memcmp: both ranges are valid.
    unsafe {
        for i in 0..n {
            let (x, y) = (*a.add(i), *b.add(i));
            if x != y {
                return i32::from(x) - i32::from(y);
            }
        }
    }
    0
}

/// # Safety
/// As C's bcmp.
#[unsafe(no_mangle)]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: as memcmp.
    unsafe { memcmp(a, b, n) }
}

#[unsafe(no_mangle)]
extern "C" fn rust_eh_personality() {}

// The kernel starts a process at `_start` with the stack pointer at argc, then argv, a null, envp, a null.
// It is aligned to 16 bytes; `call` pushes 8 more, which is what a function expects at its entry.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {entry}",
    "ud2",
    entry = sym entry,
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "mov x0, sp",
    "bl {entry}",
    "brk #0",
    entry = sym entry,
);

/// # Safety
/// Called once, by `_start`, with the process's initial stack pointer.
unsafe extern "C" fn entry(stack: *const usize) -> ! {
    // SAFETY: the initial stack holds argc, then argc pointers and a null (argv), then envp ending in a
    // null, all valid for the life of the process.
    unsafe {
        let argc = *stack;
        let argv = stack.add(1).cast::<*const u8>();
        let envp = argv.add(argc + 1);
        enter::main(argc, argv, envp)
    }
}

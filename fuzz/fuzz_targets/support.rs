//! Shared by the fuzz targets (included with `#[path]`; not a target itself).

/// Turns a stack overflow into a crash that libFuzzer records.
///
/// Without a sanitizer (`-s none`, what scripts/fuzz.sh builds) nothing handles SIGSEGV on an
/// alternate stack: libFuzzer's handler would need the very stack that just overflowed, so the
/// process dies silently, without a crash artifact. This installs, before libFuzzer sets its
/// own handlers, a SIGSEGV handler on an alternate stack that re-raises the fault as SIGABRT;
/// libFuzzer chains to it and, as the SIGABRT arrives while the alternate stack is in use, its
/// crash handler runs there and writes the input to `fuzz/artifacts/<target>/crash-…`.
/// Where a sanitizer already handles SIGSEGV (AddressSanitizer reports stack overflows itself),
/// this does nothing.
pub fn catch_stack_overflow() {
    const ALT_STACK: usize = 1 << 20;
    // SAFETY: plain libc calls on zero-initialised C structs, made once at start-up on the main
    // thread (the one libFuzzer runs inputs on); the alternate stack is leaked, so lives forever.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return;
        }
        let stack: &'static mut [u8] = Box::leak(vec![0u8; ALT_STACK].into_boxed_slice());
        let ss = libc::stack_t {
            ss_sp: stack.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: ALT_STACK,
        };
        if libc::sigaltstack(&ss, std::ptr::null_mut()) != 0 {
            return;
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_segv as extern "C" fn(_, _, _) as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut());
    }
}

extern "C" fn on_segv(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    const MSG: &[u8] =
        b"\n==fuzz== SIGSEGV: a stack overflow (unbounded recursion?) or a bad memory access\n";
    // SAFETY: async-signal-safe calls only.
    unsafe {
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        libc::raise(libc::SIGABRT);
        libc::_exit(134);
    }
}

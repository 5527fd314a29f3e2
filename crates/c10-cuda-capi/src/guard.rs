//! The boundary's safety net: every entry point runs inside [`guard`], which turns errors and
//! panics into the C return value and the calling thread's last error (`tm_last_error`).

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    /// The calling thread's last error, NUL-terminated (`tm_last_error`).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Sets the calling thread's last error (interior NUL bytes become spaces, so the message
/// survives whole).
pub fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // During thread teardown the slot may be gone; the error is then dropped.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

/// The calling thread's last error ("" when none), valid until the next [`set_last_error`] on
/// this thread.
pub fn last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Runs the body of entry point `name`: its `Ok` value is returned; an `Err(message)` or a
/// panic sets the last error (prefixed with `name`) and returns `on_error`. Nothing unwinds
/// out of it.
pub fn guard<T>(name: &'static str, on_error: T, body: impl FnOnce() -> Result<T, String>) -> T {
    let result = catch_unwind(AssertUnwindSafe(|| {
        inject_panic(name);
        body()
    }));
    match result {
        Ok(Ok(value)) => value,
        Ok(Err(message)) => {
            set_last_error(&format!("{name}: {message}"));
            on_error
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            set_last_error(&format!(
                "{name}: internal error (a panic was caught at the C boundary): {what}"
            ));
            on_error
        }
    }
}

/// With the `inject-panic` feature (test builds), panics when `TENSORMEM_ALLOC_INJECT_PANIC`
/// names this entry point.
#[cfg(feature = "inject-panic")]
fn inject_panic(name: &str) {
    if std::env::var_os("TENSORMEM_ALLOC_INJECT_PANIC").is_some_and(|v| v == name) {
        panic!("panic injected into {name} (TENSORMEM_ALLOC_INJECT_PANIC)");
    }
}

#[cfg(not(feature = "inject-panic"))]
#[inline(always)]
fn inject_panic(_name: &str) {}

/// Copies `text` into the caller's buffer as `snprintf` does: at most `len - 1` bytes and a
/// NUL (nothing when `len` is 0). Returns the length of `text`.
///
/// # Safety
/// When `len > 0`, `buf` must be valid for writes of `len` bytes.
pub unsafe fn write_c_string(text: &str, buf: *mut c_char, len: usize) -> Result<isize, String> {
    let total = isize::try_from(text.len()).map_err(|_| "output too large".to_string())?;
    if len == 0 {
        return Ok(total);
    }
    if buf.is_null() {
        return Err(format!("buf is NULL but len is {len}"));
    }
    let n = text.len().min(len - 1);
    // SAFETY: the caller guarantees `buf` is writable for `len` bytes and `n + 1 <= len`; the
    // source is our own string, which cannot overlap the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(total)
}

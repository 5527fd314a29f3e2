//! A safe, fast reader and writer of Python pickles of plain builtins: PyTorch memory snapshots
//! (`torch.cuda.memory._dump_snapshot()`).
//!
//! ```
//! use tensormem_pickle::{Value, decode, encode};
//!
//! let snapshot = Value::dict(vec![(Value::str("segments"), Value::list(vec![]))]);
//! let bytes = encode(&snapshot);
//! let back = decode(&bytes)?;
//! assert_eq!(back.get("segments").and_then(Value::as_list).map(<[Value]>::len), Some(0));
//! # Ok::<(), tensormem_pickle::DecodeError>(())
//! ```
//!
//! # Security model: data only, never code
//! A pickle is a program for a stack machine, and CPython's unpickler will import and call any
//! callable a pickle names (`GLOBAL os system` + `REDUCE` runs a shell command). This decoder
//! runs only the opcodes that build `None`, `bool`, `int`, `float`, `str`, `bytes`, `list`,
//! `tuple`, `dict`, `set` and `frozenset`. It refuses, with [`DecodeError::Forbidden`] naming the
//! opcode, its byte offset and (for `GLOBAL`, `INST`, `STACK_GLOBAL`) the `module.name` asked for:
//! `GLOBAL`, `STACK_GLOBAL`, `INST`, `OBJ`, `REDUCE`, `BUILD`, `NEWOBJ`, `NEWOBJ_EX`, `EXT1/2/4`,
//! `PERSID`, `BINPERSID`, `NEXT_BUFFER` and `READONLY_BUFFER`. Nothing is imported, called or
//! looked up; snapshots never need these opcodes.
//!
//! Hostile input cannot make it panic, hang, or allocate much more than the input: every length
//! field is checked against the remaining input before anything is allocated, nesting is
//! limited to [`MAX_DEPTH`], memo keys far beyond the memo's size go to a map instead of growing
//! a vector, and dict keys are merged through a hash index with random keys (no quadratic blow-up
//! on many keys).
//!
//! # Memo sharing
//! PyTorch snapshots share their stack frames through the pickle memo: one frame dict is
//! referenced thousands of times with `BINGET`. Every string and container of a [`Value`] sits
//! behind a [`Shared`] (`Arc`) pointer, so a memo reference is a reference-count increment, and
//! the decoded value has the same shape in memory as the pickle: each shared frame exists once.
//! [`encode`] keeps that sharing (a pointer with several holders is written once, then
//! referenced).
//!
//! Lists, dicts and sets are filled after they are memoized; the decoder keeps them mutable
//! beside its stack while they are filled and freezes them (moves them into an `Arc`) when they
//! leave the stack or are referenced again. Changing a container after that only happens in
//! recursive structures (a list that contains itself), which a snapshot never holds: it is
//! refused with [`DecodeError::RecursiveStructure`], so there are no reference cycles (and no
//! leaks).
//!
//! # Semantics worth knowing
//! - Data after the STOP opcode is ignored by [`decode`], as by CPython's `pickle.loads`;
//!   [`decode_exact`] refuses it, [`decode_prefix`] reports how much was used.
//! - At STOP the stack must hold exactly one value and no open MARK (CPython is laxer: it
//!   returns the top value).
//! - Python 2 `str` (`STRING`, `BINSTRING`, `SHORT_BINSTRING`) decodes to [`Value::Str`], each
//!   byte a Latin-1 character (`pickle.loads(data, encoding="latin1")`; for ASCII the same as
//!   CPython's default). `BYTEARRAY8` decodes to [`Value::Bytes`].
//! - Lone surrogates in `BINUNICODE` (CPython accepts them) are [`DecodeError::InvalidUtf8`].
//! - `INT`/`LONG` text must be plain decimal of at most [`MAX_STR_DIGITS`] digits.
//! - Dict keys and set members are merged as Python merges them (`1`, `1.0` and `True` are one
//!   key; the first key's position, the last value); unhashable keys are errors.

mod decode;
mod encode;
mod error;
mod json;
mod key;
mod opcodes;
mod text;
mod value;

pub use decode::{
    HIGHEST_PROTOCOL, MAX_DEPTH, decode, decode_exact, decode_prefix, from_reader, from_slice,
};
pub use encode::encode;
pub use error::{DecodeError, JsonError};
pub use json::from_json;
pub use value::{BigInt, Dict, MAX_STR_DIGITS, Shared, Value};

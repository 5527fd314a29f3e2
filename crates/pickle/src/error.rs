//! Errors of decoding ([`DecodeError`]) and of JSON export ([`JsonError`]).
//!
//! Every decode error that points into the input carries `offset`: the byte position of the
//! opcode (or of the field) at fault, counted from the start of the input.

/// Why a pickle could not be decoded.
///
/// No input makes the decoder panic, execute anything, or allocate more than a small multiple of
/// the input's length; each refusal is one of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input has no bytes at all.
    #[error("empty input: a pickle holds at least a STOP opcode")]
    Empty,

    /// An opcode's argument runs past the end of the input (a length field claiming more bytes
    /// than remain lands here, before any allocation).
    #[error("input truncated at byte {offset}: needs {needed} bytes, {available} left")]
    Truncated {
        /// Where the read started.
        offset: usize,
        /// How many bytes the opcode needed there (as claimed, possibly absurd).
        needed: u64,
        /// How many bytes were left.
        available: usize,
    },

    /// The input ended between opcodes without a STOP.
    #[error("no STOP opcode: the input ends at byte {offset}")]
    NoStop {
        /// The input's length.
        offset: usize,
    },

    /// A byte that is no pickle opcode.
    #[error("unknown opcode 0x{opcode:02x} at byte {offset}")]
    UnknownOpcode {
        /// The byte read.
        opcode: u8,
        /// Its position.
        offset: usize,
    },

    /// An opcode that would import, call or build an arbitrary object: refused, never executed.
    #[error(
        "refusing to load: {detail} ({opcode_name} at byte {offset}); snapshots contain only plain data"
    )]
    Forbidden {
        /// The opcode's name in `pickletools` (`GLOBAL`, `REDUCE`, ...).
        opcode_name: &'static str,
        /// Its position.
        offset: usize,
        /// What it tried, e.g. "the pickle names a callable `posix.system`".
        detail: String,
    },

    /// An opcode needed more values than the stack (above the innermost MARK) holds.
    #[error("stack underflow: {opcode_name} at byte {offset} needs more values on the stack")]
    StackUnderflow {
        /// The opcode's name.
        opcode_name: &'static str,
        /// Its position.
        offset: usize,
    },

    /// An opcode that ends a MARK found none open.
    #[error("{opcode_name} at byte {offset} needs a MARK, but none is open")]
    NoMark {
        /// The opcode's name.
        opcode_name: &'static str,
        /// Its position.
        offset: usize,
    },

    /// A memo read (GET, BINGET, LONG_BINGET) of a key that was never stored.
    #[error("memo key {key} read at byte {offset} was never stored")]
    BadMemoKey {
        /// The key.
        key: u64,
        /// The reading opcode's position.
        offset: usize,
    },

    /// A text opcode whose bytes are not valid UTF-8 (lone surrogates, which CPython accepts with
    /// `surrogatepass`, land here too: Rust strings cannot hold them).
    #[error("invalid UTF-8 in the string at byte {offset}")]
    InvalidUtf8 {
        /// The string opcode's position.
        offset: usize,
    },

    /// A container was modified after it had been shared: referenced from the memo while still
    /// being filled (which only a recursive structure, such as a list containing itself, needs)
    /// or after it left the stack.
    #[error(
        "{opcode_name} at byte {offset} modifies a container that is already shared: recursive structures are not supported"
    )]
    RecursiveStructure {
        /// The modifying opcode's name (APPEND, SETITEMS, ...).
        opcode_name: &'static str,
        /// Its position.
        offset: usize,
    },

    /// Containers nested deeper than [`crate::MAX_DEPTH`].
    #[error("containers nested deeper than {limit} levels at byte {offset}")]
    TooDeep {
        /// The limit.
        limit: usize,
        /// The nesting opcode's position.
        offset: usize,
    },

    /// A PROTO opcode with a version above 5.
    #[error("unsupported pickle protocol {version} at byte {offset} (0 to 5 are supported)")]
    UnsupportedProtocol {
        /// The version named.
        version: u8,
        /// The PROTO opcode's position.
        offset: usize,
    },

    /// Bytes after the STOP opcode, from [`crate::decode_exact`] only ([`crate::decode`] ignores
    /// them, like CPython's `pickle.loads`).
    #[error("{extra} bytes of trailing data after the STOP opcode ending at byte {offset}")]
    TrailingData {
        /// Where the trailing data starts.
        offset: usize,
        /// How many bytes follow.
        extra: usize,
    },

    /// Anything else that is not a well-formed pickle of plain data: a wrong argument type (an
    /// APPEND to a dict, an unhashable dict key), a bad text literal, stack items left at STOP.
    #[error("malformed pickle at byte {offset}: {reason}")]
    Malformed {
        /// The opcode's position.
        offset: usize,
        /// What is wrong.
        reason: String,
    },

    /// Reading the input failed ([`crate::from_reader`] only).
    #[error("reading the pickle: {0}")]
    Io(#[from] std::io::Error),
}

/// Why a [`crate::Value`] could not be written as JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonError {
    /// A dict key that is neither a `str` nor an `int`.
    #[error("a dict key of type {type_name} cannot be a JSON object key (only str and int can)")]
    UnsupportedKey {
        /// The key's Python type name.
        type_name: &'static str,
    },
    /// A `bytes` value: JSON has no byte strings, and we do not guess an encoding.
    #[error("bytes ({len} of them) cannot be written as JSON")]
    Bytes {
        /// How many bytes.
        len: usize,
    },
    /// An integer with more than [`crate::MAX_STR_DIGITS`] decimal digits.
    #[error("an integer of {bytes} bytes has too many digits for JSON text")]
    IntTooLarge {
        /// Its size in bytes.
        bytes: usize,
    },
}

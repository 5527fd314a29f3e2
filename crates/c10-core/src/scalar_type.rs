//! [`ScalarType`], the element type of a tensor, as c10's `ScalarType`, and [`Element`], the
//! trait tying a Rust type to its `ScalarType`.
//!
//! Each scalar type has two names: c10's `toString` name ([`ScalarType::name`], `"Float"`, also
//! what `Display` prints, as c10's `operator<<`) and the name in Python's dtype repr
//! ([`ScalarType::torch_name`], `"float32"` for `torch.float32`). `FromStr` accepts both, the
//! Python aliases (`"float"`, `"long"`, `"half"`, ...) and a `"torch."` prefix.
//!
//! `bool` cannot implement [`Element`] because `Element` requires `bytemuck::Pod` (every bit
//! pattern valid) and only 0 and 1 are valid `bool`s; the [`Bool`] newtype over `u8` stands in.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The element type of a tensor, as c10's `ScalarType`. Discriminants are c10's enum values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i8)]
pub enum ScalarType {
    /// `uint8_t`, `torch.uint8` (c10 `Byte`).
    Byte = 0,
    /// `int8_t`, `torch.int8` (c10 `Char`).
    Char = 1,
    /// `int16_t`, `torch.int16` (c10 `Short`).
    Short = 2,
    /// `int32_t`, `torch.int32` (c10 `Int`).
    Int = 3,
    /// `int64_t`, `torch.int64` (c10 `Long`).
    Long = 4,
    /// IEEE binary16, `torch.float16` (c10 `Half`).
    Half = 5,
    /// IEEE binary32, `torch.float32` (c10 `Float`).
    Float = 6,
    /// IEEE binary64, `torch.float64` (c10 `Double`).
    Double = 7,
    /// Two binary32 values, `torch.complex64` (c10 `ComplexFloat`).
    ComplexFloat = 9,
    /// Two binary64 values, `torch.complex128` (c10 `ComplexDouble`).
    ComplexDouble = 10,
    /// One byte holding 0 or 1, `torch.bool` (c10 `Bool`).
    Bool = 11,
    /// Brain floating point (8-bit exponent, 7-bit mantissa), `torch.bfloat16` (c10 `BFloat16`).
    BFloat16 = 15,
}

impl ScalarType {
    /// Every scalar type, in c10 enum order.
    pub const ALL: [ScalarType; 12] = [
        ScalarType::Byte,
        ScalarType::Char,
        ScalarType::Short,
        ScalarType::Int,
        ScalarType::Long,
        ScalarType::Half,
        ScalarType::Float,
        ScalarType::Double,
        ScalarType::ComplexFloat,
        ScalarType::ComplexDouble,
        ScalarType::Bool,
        ScalarType::BFloat16,
    ];

    /// Size of one element in bytes, as c10's `elementSize(ScalarType)`.
    pub const fn item_size(self) -> usize {
        match self {
            ScalarType::Byte | ScalarType::Char | ScalarType::Bool => 1,
            ScalarType::Short | ScalarType::Half | ScalarType::BFloat16 => 2,
            ScalarType::Int | ScalarType::Float => 4,
            ScalarType::Long | ScalarType::Double | ScalarType::ComplexFloat => 8,
            ScalarType::ComplexDouble => 16,
        }
    }

    /// c10's name (`"Float"`, `"Long"`, `"BFloat16"`), as c10's `toString(ScalarType)`.
    pub const fn name(self) -> &'static str {
        match self {
            ScalarType::Byte => "Byte",
            ScalarType::Char => "Char",
            ScalarType::Short => "Short",
            ScalarType::Int => "Int",
            ScalarType::Long => "Long",
            ScalarType::Half => "Half",
            ScalarType::Float => "Float",
            ScalarType::Double => "Double",
            ScalarType::ComplexFloat => "ComplexFloat",
            ScalarType::ComplexDouble => "ComplexDouble",
            ScalarType::Bool => "Bool",
            ScalarType::BFloat16 => "BFloat16",
        }
    }

    /// The name in Python's dtype repr without the `torch.` prefix (`"float32"` for
    /// `torch.float32`), as `str(torch.float32)`.
    pub const fn torch_name(self) -> &'static str {
        match self {
            ScalarType::Byte => "uint8",
            ScalarType::Char => "int8",
            ScalarType::Short => "int16",
            ScalarType::Int => "int32",
            ScalarType::Long => "int64",
            ScalarType::Half => "float16",
            ScalarType::Float => "float32",
            ScalarType::Double => "float64",
            ScalarType::ComplexFloat => "complex64",
            ScalarType::ComplexDouble => "complex128",
            ScalarType::Bool => "bool",
            ScalarType::BFloat16 => "bfloat16",
        }
    }

    /// Whether this is a real floating point type (Half, Float, Double, BFloat16), as c10's
    /// `isFloatingType`.
    pub const fn is_floating_point(self) -> bool {
        matches!(
            self,
            ScalarType::Half | ScalarType::Float | ScalarType::Double | ScalarType::BFloat16
        )
    }

    /// Whether this is a complex type, as c10's `isComplexType`.
    pub const fn is_complex(self) -> bool {
        matches!(self, ScalarType::ComplexFloat | ScalarType::ComplexDouble)
    }

    /// Whether this is an integer type (Byte, Char, Short, Int, Long), counting Bool only when
    /// `include_bool`, as c10's `isIntegralType(t, includeBool)`.
    pub const fn is_integral(self, include_bool: bool) -> bool {
        match self {
            ScalarType::Byte
            | ScalarType::Char
            | ScalarType::Short
            | ScalarType::Int
            | ScalarType::Long => true,
            ScalarType::Bool => include_bool,
            _ => false,
        }
    }

    /// Python's aliases for some dtypes (`torch.float` is `torch.float32`).
    fn from_alias(s: &str) -> Option<ScalarType> {
        Some(match s {
            "float" => ScalarType::Float,
            "double" => ScalarType::Double,
            "half" => ScalarType::Half,
            "short" => ScalarType::Short,
            "int" => ScalarType::Int,
            "long" => ScalarType::Long,
            "cfloat" => ScalarType::ComplexFloat,
            "cdouble" => ScalarType::ComplexDouble,
            _ => return None,
        })
    }
}

impl fmt::Display for ScalarType {
    /// c10's name (`"Float"`), as c10's `operator<<(std::ostream&, ScalarType)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScalarType {
    type Err = Error;

    /// Parses a torch dtype name (`"float32"`, `"torch.int64"`), a Python alias (`"float"`,
    /// `"long"`) or a c10 name (`"Float"`). Case-sensitive.
    ///
    /// # Errors
    /// [`Error::InvalidScalarType`] naming the string when it matches none of these.
    fn from_str(s: &str) -> Result<Self> {
        let name = s.strip_prefix("torch.").unwrap_or(s);
        ScalarType::ALL
            .into_iter()
            .find(|t| t.torch_name() == name || t.name() == name)
            .or_else(|| ScalarType::from_alias(name))
            .ok_or_else(|| Error::InvalidScalarType {
                input: s.to_owned(),
            })
    }
}

/// A `torch.bool` element: one byte, 0 for false and anything else (normally 1) for true.
///
/// A newtype over `u8` because `bool` is not `bytemuck::Pod`; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Bool(pub u8);

impl Bool {
    /// The value as a `bool` (any non-zero byte is true).
    pub const fn get(self) -> bool {
        self.0 != 0
    }
}

impl From<bool> for Bool {
    fn from(value: bool) -> Self {
        Bool(u8::from(value))
    }
}

impl From<Bool> for bool {
    fn from(value: Bool) -> Self {
        value.get()
    }
}

/// A Rust type that is the element of a tensor of [`Element::SCALAR_TYPE`], as the pairs in c10's
/// `AT_FORALL_SCALAR_TYPES` (`CppTypeToScalarType<T>`).
///
/// Implemented for `u8`, `i8`, `i16`, `i32`, `i64`, `half::f16`, `f32`, `f64`, `half::bf16` and
/// [`Bool`]. `size_of::<T>()` always equals `T::SCALAR_TYPE.item_size()` (checked at compile time).
pub trait Element:
    bytemuck::Pod + fmt::Debug + PartialEq + Default + Send + Sync + 'static
{
    /// The scalar type whose elements are `Self`.
    const SCALAR_TYPE: ScalarType;
}

macro_rules! impl_element {
    ($($ty:ty => $scalar:ident),* $(,)?) => {
        $(
            impl Element for $ty {
                const SCALAR_TYPE: ScalarType = ScalarType::$scalar;
            }
            const _: () = assert!(size_of::<$ty>() == ScalarType::$scalar.item_size());
        )*
    };
}

impl_element! {
    u8 => Byte,
    i8 => Char,
    i16 => Short,
    i32 => Int,
    i64 => Long,
    half::f16 => Half,
    f32 => Float,
    f64 => Double,
    half::bf16 => BFloat16,
    Bool => Bool,
}

//! Element arithmetic for the kernels ([`Elem`], [`Num`], [`Float`]) and the dtype dispatch
//! macros, as ATen's `AT_DISPATCH_*` macros and `c10::convert`.
//!
//! * [`Elem`]: every element type (`u8`, `i8`, `i16`, `i32`, `i64`, `f16`, `f32`, `f64`,
//!   `bf16`, [`Bool`]): conversions, as `c10::static_cast_with_inter_type`.
//! * [`Num`]: the integer and `f32`/`f64` types: `+ - *`, negation, comparison, division with
//!   rounding and powers. Integer arithmetic wraps, as C++ (and so ATen) does on CPU.
//! * [`Float`]: `f32` and `f64`: the transcendental functions.

use c10_core::{Bool, Element};
use half::{bf16, f16};

/// An element type the kernels can convert to and from, as the types of ATen's
/// `AT_DISPATCH_ALL_TYPES_AND3(Half, BFloat16, Bool, ...)`.
pub(crate) trait Elem: Element + Copy {
    /// Whether the type is a floating point type (conversions go through `f64`).
    const IS_FLOATING: bool;

    /// The value as `f64` (exact except for `i64` beyond 2^53).
    fn to_f64(self) -> f64;

    /// The value nearest `v`: rounding for floats, `v != 0` for Bool, truncation toward zero for
    /// integers. `u8` goes through `i64` (so -1.5 gives 255, 300.7 gives 44), as c10's
    /// `static_cast_with_inter_type<uint8_t, float>`, whose result C++ defines; the other integer
    /// types saturate out of range and give 0 for NaN (Rust's `as`), where C++ leaves the
    /// conversion undefined (PyTorch on x86 gives `INT_MIN` of a 32- or 64-bit intermediate).
    fn from_f64(v: f64) -> Self;

    /// The value as `i64` (truncated for floats).
    fn to_i64(self) -> i64;

    /// `v` converted, wrapping for narrower integers (as C++'s integral conversions).
    fn from_i64(v: i64) -> Self;

    /// The value converted to `D`: exactly between integer types (wrapping when narrowing),
    /// through `f64` when either side is a floating point type.
    #[inline(always)]
    fn cast<D: Elem>(self) -> D {
        if Self::IS_FLOATING || D::IS_FLOATING {
            D::from_f64(self.to_f64())
        } else {
            D::from_i64(self.to_i64())
        }
    }
}

/// The numeric types with arithmetic: integers and `f32`/`f64`.
pub(crate) trait Num: Elem + PartialOrd {
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// `self + other` (wrapping for integers).
    fn add(self, other: Self) -> Self;
    /// `self - other` (wrapping for integers).
    fn sub(self, other: Self) -> Self;
    /// `self * other` (wrapping for integers).
    fn mul(self, other: Self) -> Self;
    /// `-self` (wrapping for integers).
    fn neg(self) -> Self;
    /// Whether the value is NaN (never for integers).
    fn is_nan(self) -> bool;
    /// Whether the value is zero (a divisor integer division refuses).
    fn is_zero(self) -> bool;
    /// `self / other` rounded toward zero, as ATen's `div_trunc`: C++'s integer division
    /// (wrapping for `MIN / -1`; the caller refuses a zero divisor), `trunc(a / b)` for floats.
    fn div_trunc(self, other: Self) -> Self;
    /// `self / other` rounded toward negative infinity, as ATen's `div_floor_integer` and
    /// `div_floor_floating` (for floats: from `fmod`, so `-0.0` and infinities come out as in
    /// Python's `//`).
    fn div_floor(self, other: Self) -> Self;
    /// `self ^ other`: for integers by repeated squaring with wrapping, a negative exponent giving
    /// 0 except for bases 1 and -1, as ATen's `powi`; for floats `powf`.
    fn pow(self, other: Self) -> Self;
}

/// The floating point types with transcendental functions: `f32` and `f64`.
pub(crate) trait Float: Num {
    /// `self / other`.
    fn div(self, other: Self) -> Self;
    /// `e^self`.
    fn exp(self) -> Self;
    /// The natural logarithm.
    fn ln(self) -> Self;
    /// The square root.
    fn sqrt(self) -> Self;
    /// The hyperbolic tangent.
    fn tanh(self) -> Self;
    /// The error function (libm's `erf`/`erff`).
    fn erf(self) -> Self;
    /// The value as `f64`, for accumulation.
    fn widen(self) -> f64;
    /// `v` rounded to this type.
    fn narrow(v: f64) -> Self;
}

macro_rules! impl_int {
    ($($t:ty => $from_f64:expr),*) => {$(
        impl Elem for $t {
            const IS_FLOATING: bool = false;
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)]
            fn from_f64(v: f64) -> Self { $from_f64(v) }
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
        }
        impl Num for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline(always)]
            fn add(self, other: Self) -> Self { self.wrapping_add(other) }
            #[inline(always)]
            fn sub(self, other: Self) -> Self { self.wrapping_sub(other) }
            #[inline(always)]
            fn mul(self, other: Self) -> Self { self.wrapping_mul(other) }
            #[inline(always)]
            fn neg(self) -> Self { self.wrapping_neg() }
            #[inline(always)]
            fn is_nan(self) -> bool { false }
            #[inline(always)]
            fn is_zero(self) -> bool { self == 0 }
            #[inline(always)]
            fn div_trunc(self, other: Self) -> Self { self.wrapping_div(other) }
            #[inline(always)]
            fn div_floor(self, other: Self) -> Self {
                let quot = self.wrapping_div(other);
                #[allow(unused_comparisons)]
                let signs_differ = (self < 0) != (other < 0);
                if signs_differ && self.wrapping_rem(other) != 0 { quot.wrapping_sub(1) } else { quot }
            }
            #[inline(always)]
            fn pow(self, other: Self) -> Self {
                #[allow(unused_comparisons)]
                if other < 0 {
                    // Only reachable for signed types; 1 and -1 keep a magnitude of 1.
                    return if self == 1 {
                        1
                    } else if self.wrapping_add(1) == 0 {
                        if other % 2 == 0 { 1 } else { self }
                    } else {
                        0
                    };
                }
                let (mut base, mut exp, mut result): (Self, Self, Self) = (self, other, 1);
                while exp != 0 {
                    if exp & 1 == 1 {
                        result = result.wrapping_mul(base);
                    }
                    exp >>= 1;
                    base = base.wrapping_mul(base);
                }
                result
            }
        }
    )*};
}

// u8 through i64, as c10's `static_cast_with_inter_type<uint8_t, ...>`; the others as Rust's `as`.
impl_int!(
    u8 => |v: f64| (v as i64) as u8,
    i8 => |v: f64| v as i8,
    i16 => |v: f64| v as i16,
    i32 => |v: f64| v as i32,
    i64 => |v: f64| v as i64
);

macro_rules! impl_float {
    ($($t:ty => $erf:path),*) => {$(
        impl Elem for $t {
            const IS_FLOATING: bool = true;
            #[inline(always)]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)]
            fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
        }
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn add(self, other: Self) -> Self { self + other }
            #[inline(always)]
            fn sub(self, other: Self) -> Self { self - other }
            #[inline(always)]
            fn mul(self, other: Self) -> Self { self * other }
            #[inline(always)]
            fn neg(self) -> Self { -self }
            #[inline(always)]
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
            #[inline(always)]
            fn is_zero(self) -> bool { self == 0.0 }
            #[inline(always)]
            fn div_trunc(self, other: Self) -> Self { (self / other).trunc() }
            #[inline(always)]
            fn div_floor(self, other: Self) -> Self {
                if other == 0.0 {
                    return self / other;
                }
                let rem = self % other; // C's fmod
                let mut div = (self - rem) / other;
                if rem != 0.0 && (other < 0.0) != (rem < 0.0) {
                    div -= 1.0;
                }
                if div == 0.0 {
                    return (0.0 as $t).copysign(self / other);
                }
                let floor = div.floor();
                if div - floor > 0.5 { floor + 1.0 } else { floor }
            }
            #[inline(always)]
            fn pow(self, other: Self) -> Self { <$t>::powf(self, other) }
        }
        impl Float for $t {
            #[inline(always)]
            fn div(self, other: Self) -> Self { self / other }
            #[inline(always)]
            fn exp(self) -> Self { <$t>::exp(self) }
            #[inline(always)]
            fn ln(self) -> Self { <$t>::ln(self) }
            #[inline(always)]
            fn sqrt(self) -> Self { <$t>::sqrt(self) }
            #[inline(always)]
            fn tanh(self) -> Self { <$t>::tanh(self) }
            #[inline(always)]
            fn erf(self) -> Self { $erf(self) }
            #[inline(always)]
            fn widen(self) -> f64 { self as f64 }
            #[inline(always)]
            fn narrow(v: f64) -> Self { v as $t }
        }
    )*};
}

impl_float!(f32 => libm::erff, f64 => libm::erf);

/// `Elem` for the 16-bit floats, through `f64` (no arithmetic kernels use them).
macro_rules! impl_half {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const IS_FLOATING: bool = true;
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            fn to_i64(self) -> i64 {
                <$t>::to_f64(self) as i64
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f64(v as f64)
            }
        }
    )*};
}

impl_half!(f16, bf16);

impl Elem for Bool {
    const IS_FLOATING: bool = false;
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self.get()))
    }
    fn from_f64(v: f64) -> Self {
        Bool::from(v != 0.0)
    }
    fn to_i64(self) -> i64 {
        i64::from(self.get())
    }
    fn from_i64(v: i64) -> Self {
        Bool::from(v != 0)
    }
}

/// Runs `$body` with the type alias `$T` bound to the Rust type of `$dtype`, for one group of
/// dtypes, as ATen's `AT_DISPATCH_*` macros; any other dtype gives
/// [`crate::Error::UnsupportedDtype`] for `$op`. The body must evaluate to a `Result`.
///
/// Groups: `float` (Float, Double), `num` (the integers, Float, Double), `all` (every dtype but
/// the complex ones).
macro_rules! dispatch {
    (float, $op:expr, $dtype:expr, |$T:ident| $body:expr) => {
        match $dtype {
            c10_core::ScalarType::Float => {
                type $T = f32;
                $body
            }
            c10_core::ScalarType::Double => {
                type $T = f64;
                $body
            }
            other => Err($crate::error::Error::UnsupportedDtype {
                op: $op,
                dtype: other,
            }),
        }
    };
    (num, $op:expr, $dtype:expr, |$T:ident| $body:expr) => {
        match $dtype {
            c10_core::ScalarType::Byte => {
                type $T = u8;
                $body
            }
            c10_core::ScalarType::Char => {
                type $T = i8;
                $body
            }
            c10_core::ScalarType::Short => {
                type $T = i16;
                $body
            }
            c10_core::ScalarType::Int => {
                type $T = i32;
                $body
            }
            c10_core::ScalarType::Long => {
                type $T = i64;
                $body
            }
            other => dispatch!(float, $op, other, |$T| $body),
        }
    };
    (all, $op:expr, $dtype:expr, |$T:ident| $body:expr) => {
        match $dtype {
            c10_core::ScalarType::Half => {
                type $T = half::f16;
                $body
            }
            c10_core::ScalarType::BFloat16 => {
                type $T = half::bf16;
                $body
            }
            c10_core::ScalarType::Bool => {
                type $T = c10_core::Bool;
                $body
            }
            other => dispatch!(num, $op, other, |$T| $body),
        }
    };
}

pub(crate) use dispatch;

//! `ScalarType` sizes, names, classification and parsing; `Element` ties Rust types to them.

use c10_core::{Bool, Element, Error, ScalarType};
use rstest::rstest;

#[rstest]
#[case::byte(ScalarType::Byte, 1, "Byte", "uint8")]
#[case::char(ScalarType::Char, 1, "Char", "int8")]
#[case::short(ScalarType::Short, 2, "Short", "int16")]
#[case::int(ScalarType::Int, 4, "Int", "int32")]
#[case::long(ScalarType::Long, 8, "Long", "int64")]
#[case::half(ScalarType::Half, 2, "Half", "float16")]
#[case::float(ScalarType::Float, 4, "Float", "float32")]
#[case::double(ScalarType::Double, 8, "Double", "float64")]
#[case::complex_float(ScalarType::ComplexFloat, 8, "ComplexFloat", "complex64")]
#[case::complex_double(ScalarType::ComplexDouble, 16, "ComplexDouble", "complex128")]
#[case::bool(ScalarType::Bool, 1, "Bool", "bool")]
#[case::bfloat16(ScalarType::BFloat16, 2, "BFloat16", "bfloat16")]
fn sizes_and_names(
    #[case] scalar_type: ScalarType,
    #[case] item_size: usize,
    #[case] name: &str,
    #[case] torch_name: &str,
) {
    assert_eq!(scalar_type.item_size(), item_size);
    assert_eq!(scalar_type.name(), name);
    assert_eq!(scalar_type.torch_name(), torch_name);
    assert_eq!(scalar_type.to_string(), name);
    assert_eq!(torch_name.parse::<ScalarType>().unwrap(), scalar_type);
    assert_eq!(
        format!("torch.{torch_name}").parse::<ScalarType>().unwrap(),
        scalar_type
    );
    assert_eq!(name.parse::<ScalarType>().unwrap(), scalar_type);
}

#[rstest]
#[case::byte(ScalarType::Byte, false, true, true)]
#[case::char(ScalarType::Char, false, true, true)]
#[case::long(ScalarType::Long, false, true, true)]
#[case::bool(ScalarType::Bool, false, false, true)]
#[case::half(ScalarType::Half, true, false, false)]
#[case::float(ScalarType::Float, true, false, false)]
#[case::double(ScalarType::Double, true, false, false)]
#[case::bfloat16(ScalarType::BFloat16, true, false, false)]
#[case::complex_float(ScalarType::ComplexFloat, false, false, false)]
fn classification(
    #[case] scalar_type: ScalarType,
    #[case] floating: bool,
    #[case] integral: bool,
    #[case] integral_with_bool: bool,
) {
    assert_eq!(scalar_type.is_floating_point(), floating);
    assert_eq!(scalar_type.is_integral(false), integral);
    assert_eq!(scalar_type.is_integral(true), integral_with_bool);
    assert_eq!(
        scalar_type.is_complex(),
        scalar_type == ScalarType::ComplexFloat
    );
}

#[rstest]
#[case::float("float", ScalarType::Float)]
#[case::double("double", ScalarType::Double)]
#[case::half("torch.half", ScalarType::Half)]
#[case::long("long", ScalarType::Long)]
#[case::int("int", ScalarType::Int)]
#[case::short("short", ScalarType::Short)]
#[case::cfloat("cfloat", ScalarType::ComplexFloat)]
#[case::cdouble("cdouble", ScalarType::ComplexDouble)]
fn python_aliases(#[case] input: &str, #[case] expected: ScalarType) {
    assert_eq!(input.parse::<ScalarType>().unwrap(), expected);
}

#[rstest]
#[case::empty("")]
#[case::unknown("float128")]
#[case::wrong_case("FLOAT32")]
#[case::prefix_only("torch.")]
#[case::padded(" float32")]
fn invalid_names(#[case] input: &str) {
    assert_eq!(
        input.parse::<ScalarType>().unwrap_err(),
        Error::InvalidScalarType {
            input: input.to_owned()
        }
    );
}

#[test]
fn discriminants_match_c10() {
    assert_eq!(ScalarType::Byte as i8, 0);
    assert_eq!(ScalarType::Float as i8, 6);
    assert_eq!(ScalarType::Bool as i8, 11);
    assert_eq!(ScalarType::BFloat16 as i8, 15);
    assert_eq!(ScalarType::ALL.len(), 12);
}

fn element_of<T: Element>() -> (ScalarType, usize) {
    (T::SCALAR_TYPE, size_of::<T>())
}

#[rstest]
#[case::u8(element_of::<u8>(), ScalarType::Byte)]
#[case::i8(element_of::<i8>(), ScalarType::Char)]
#[case::i16(element_of::<i16>(), ScalarType::Short)]
#[case::i32(element_of::<i32>(), ScalarType::Int)]
#[case::i64(element_of::<i64>(), ScalarType::Long)]
#[case::f16(element_of::<half::f16>(), ScalarType::Half)]
#[case::f32(element_of::<f32>(), ScalarType::Float)]
#[case::f64(element_of::<f64>(), ScalarType::Double)]
#[case::bf16(element_of::<half::bf16>(), ScalarType::BFloat16)]
#[case::bool(element_of::<Bool>(), ScalarType::Bool)]
fn elements(#[case] (scalar_type, size): (ScalarType, usize), #[case] expected: ScalarType) {
    assert_eq!(scalar_type, expected);
    assert_eq!(size, expected.item_size());
}

#[test]
fn bool_newtype() {
    assert!(Bool::from(true).get());
    assert!(!Bool::from(false).get());
    assert_eq!(Bool::from(true), Bool(1));
    assert!(bool::from(Bool(2)), "any non-zero byte is true");
    let bytes: &[u8] = bytemuck::cast_slice(&[Bool(0), Bool(1)]);
    assert_eq!(bytes, &[0, 1]);
}

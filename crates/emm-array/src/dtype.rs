//! Element types and their DLPack codes.

/// DLPack's `DLDataTypeCode` values used here.
pub mod code {
    /// Signed integer.
    pub const INT: u8 = 0;
    /// Unsigned integer.
    pub const UINT: u8 = 1;
    /// IEEE float.
    pub const FLOAT: u8 = 2;
}

/// A runtime element type: DLPack code and bit width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataType {
    /// `DLDataTypeCode`.
    pub code: u8,
    /// Bits per element.
    pub bits: u8,
}

impl DataType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        usize::from(self.bits) / 8
    }

    /// The name numpy uses (`int32`, `float64`, …).
    pub fn name(self) -> &'static str {
        SUPPORTED
            .iter()
            .find(|(d, _)| *d == self)
            .map_or("unsupported", |(_, n)| n)
    }

    /// The type for `(code, bits)`, or an error listing the supported ones.
    pub fn from_code(code: u8, bits: u8) -> Result<DataType, crate::ArrayError> {
        let d = DataType { code, bits };
        if SUPPORTED.iter().any(|(s, _)| *s == d) {
            Ok(d)
        } else {
            Err(crate::ArrayError::UnsupportedType {
                code,
                bits,
                supported: supported_names(),
            })
        }
    }
}

/// Every supported element type with its numpy name.
pub const SUPPORTED: &[(DataType, &str)] = &[
    (
        DataType {
            code: code::INT,
            bits: 8,
        },
        "int8",
    ),
    (
        DataType {
            code: code::INT,
            bits: 16,
        },
        "int16",
    ),
    (
        DataType {
            code: code::INT,
            bits: 32,
        },
        "int32",
    ),
    (
        DataType {
            code: code::INT,
            bits: 64,
        },
        "int64",
    ),
    (
        DataType {
            code: code::UINT,
            bits: 8,
        },
        "uint8",
    ),
    (
        DataType {
            code: code::UINT,
            bits: 16,
        },
        "uint16",
    ),
    (
        DataType {
            code: code::UINT,
            bits: 32,
        },
        "uint32",
    ),
    (
        DataType {
            code: code::UINT,
            bits: 64,
        },
        "uint64",
    ),
    (
        DataType {
            code: code::FLOAT,
            bits: 32,
        },
        "float32",
    ),
    (
        DataType {
            code: code::FLOAT,
            bits: 64,
        },
        "float64",
    ),
];

/// The names of the supported types, comma-separated.
pub fn supported_names() -> String {
    SUPPORTED
        .iter()
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type a [`crate::MemArray`] can hold. Implemented for the numeric types
/// DLPack describes; any other type fails to compile:
///
/// ```compile_fail
/// let a = emm_array::MemArray::<bool, 1>::on_host([4]);
/// ```
pub trait Element:
    sealed::Sealed + Copy + Default + PartialEq + core::fmt::Debug + Send + Sync + 'static
{
    /// The DLPack type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $code:expr),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType { code: $code, bits: (core::mem::size_of::<$t>() * 8) as u8 };
        }
    )*};
}

element! {
    i8 => code::INT, i16 => code::INT, i32 => code::INT, i64 => code::INT,
    u8 => code::UINT, u16 => code::UINT, u32 => code::UINT, u64 => code::UINT,
    f32 => code::FLOAT, f64 => code::FLOAT,
}

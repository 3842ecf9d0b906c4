//! `enum_with_unknown!`: a wire enum that keeps the values it does not name.
//!
//! Every protocol layer (RoCEv2 opcodes and AETH syndromes, RTRS message
//! types, RNBD message types and IO flags) parses numbers off the wire that
//! a peer may send outside the known set. Such a value must survive the
//! parse, be reported and be answered, never panic or be silently mapped to
//! a known one (STYLE.md: network input never panics), so each enum gets an
//! `Unknown(raw)` variant and lossless `From` conversions both ways.
//!
//! ```
//! wire_enum::enum_with_unknown! {
//!     /// A two-value field.
//!     pub enum Kind(u8) {
//!         /// The first.
//!         A = 1,
//!         /// The second.
//!         B = 2,
//!     }
//! }
//! assert_eq!(Kind::from(2), Kind::B);
//! assert_eq!(Kind::from(9), Kind::Unknown(9));
//! assert_eq!(u8::from(Kind::Unknown(9)), 9);
//! assert_eq!(u8::from(Kind::A), 1);
//! ```

#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

/// `pub enum Name(uN) { Variant = value, ... }` plus an `Unknown(uN)`
/// variant and lossless `From` conversions both ways; `From<uN>` never
/// gives `Unknown` for a named value. Derives `Debug`, `Clone`, `Copy`,
/// `PartialEq`, `Eq`, `PartialOrd`, `Ord` and `Hash`.
#[macro_export]
macro_rules! enum_with_unknown {
    (
        $(#[$enum_meta:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$variant_meta:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$enum_meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $( $(#[$variant_meta])* $variant, )+
            /// A value this implementation does not name.
            Unknown($ty),
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant, )+
                    other => $name::Unknown(other),
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

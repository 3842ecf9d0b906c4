//! What every CM message module shares: the Communication IDs that lead each
//! body, and the macros that write the view and `Repr` boilerplate around them.
//!
//! Every message starts with its sender's Local Communication ID (bytes 0-3),
//! and every message but the REQ follows it with the receiver's, the Remote
//! Communication ID (bytes 4-7). Both are big-endian `u32`s. Each message ends
//! in a fixed-size private-data area, `field::PRIVATE_DATA` in its module.

use core::fmt;

use crate::wire::bytes::Field;

/// Local Communication ID: bytes 0-3 of every CM message.
pub(crate) const LOCAL_COMM_ID: Field = 0..4;

/// Remote Communication ID: bytes 4-7 of every CM message but the REQ.
pub(crate) const REMOTE_COMM_ID: Field = 4..8;

/// Writes ` <name>` for each flag that is set, in order: the one-bit fields a
/// `Repr`'s `Display` shows only when set.
pub(crate) fn write_flags(f: &mut fmt::Formatter<'_>, flags: &[(bool, &str)]) -> fmt::Result {
    for &(set, name) in flags {
        if set {
            write!(f, " {name}")?;
        }
    }
    Ok(())
}

/// The `Packet` view of one CM message body, with what all seven share.
///
/// ```text
/// cm_packet! {
///     /// A read/write view of an RTU body.       (the view's docs)
///     Packet "RTU";                              (the name Display prints)
///     /// The 224-byte private data area.
///     fn private_data;
///     /// Local Communication ID (the client's).
///     fn local_comm_id;
///     /// Remote Communication ID (the server's).  (omitted for the REQ)
///     fn remote_comm_id;
/// }
/// ```
///
/// Writes the view over [`BODY_LEN`](super::BODY_LEN) bytes (`header_view!`);
/// the comm-ID getters and setters; `private_data` and `private_data_mut` over
/// the calling module's `field::PRIVATE_DATA`; `Repr::buffer_len`; and
/// `Display` for the view, which prints the parsed `Repr` or `CM <name>
/// (<error>)`. The calling module defines `field::PRIVATE_DATA`, and `Repr` with
/// `parse` and `Display`.
macro_rules! cm_packet {
    (
        $(#[$view:meta])* Packet $name:literal;
        $(#[$private:meta])* fn private_data;
        $(#[$local:meta])* fn local_comm_id;
        $( $(#[$remote:meta])* fn remote_comm_id; )?
    ) => {
        header_view!($(#[$view])* Packet, $crate::wire::cm::BODY_LEN);

        impl<T: AsRef<[u8]>> Packet<T> {
            $(#[$local])*
            pub fn local_comm_id(&self) -> u32 {
                $crate::wire::bytes::read_u32_be(
                    &self.buffer.as_ref()[$crate::wire::cm::common::LOCAL_COMM_ID],
                )
            }

            $(#[$private])*
            pub fn private_data(&self) -> &[u8] {
                &self.buffer.as_ref()[field::PRIVATE_DATA]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            /// Sets the Local Communication ID.
            pub fn set_local_comm_id(&mut self, value: u32) {
                $crate::wire::bytes::write_u32_be(
                    &mut self.buffer.as_mut()[$crate::wire::cm::common::LOCAL_COMM_ID],
                    value,
                );
            }

            /// The private data area, mutably.
            pub fn private_data_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[field::PRIVATE_DATA]
            }
        }

        impl Repr<'_> {
            /// Length of the emitted body: 232.
            pub const fn buffer_len(&self) -> usize {
                $crate::wire::cm::BODY_LEN
            }
        }

        impl<T: AsRef<[u8]>> ::core::fmt::Display for Packet<T> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                match Repr::parse(&Packet::new_unchecked(self.buffer.as_ref())) {
                    Ok(repr) => write!(f, "{repr}"),
                    Err(err) => write!(f, concat!("CM ", $name, " ({})"), err),
                }
            }
        }

        $( cm_packet!(@remote_comm_id $(#[$remote])*); )?
    };
    (@remote_comm_id $(#[$remote:meta])*) => {
        impl<T: AsRef<[u8]>> Packet<T> {
            $(#[$remote])*
            pub fn remote_comm_id(&self) -> u32 {
                $crate::wire::bytes::read_u32_be(
                    &self.buffer.as_ref()[$crate::wire::cm::common::REMOTE_COMM_ID],
                )
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            /// Sets the Remote Communication ID.
            pub fn set_remote_comm_id(&mut self, value: u32) {
                $crate::wire::bytes::write_u32_be(
                    &mut self.buffer.as_mut()[$crate::wire::cm::common::REMOTE_COMM_ID],
                    value,
                );
            }
        }
    };
}

/// A whole CM message whose `Repr` is the two comm IDs, a few plain fields and
/// the private data (RTU, DREP, DREQ, MRA): [`cm_packet!`] plus the `Repr`, its
/// `parse`/`emit`, and its `Display` (`CM <name> lcomm=… rcomm=…` and the fields).
///
/// ```text
/// cm_message! {
///     <the cm_packet! input>
///     /// A parsed MRA.                          (the Repr's docs)
///     Repr "an MRA" {                            (the name with its article)
///         /// Service Timeout (5 bits).
///         service_timeout: u8 => set_service_timeout,
///     }
///     Display " service_timeout={}";             (optional: the fields' format)
/// }
/// ```
///
/// Each field is read by the view's getter of the same name and written by the
/// setter named after `=>`, in the order given; the calling module writes those.
/// The `Repr` fields are the comm IDs, the given fields, then `private_data`.
macro_rules! cm_message {
    (
        $(#[$view:meta])* Packet $name:literal;
        $(#[$private:meta])* fn private_data;
        $(#[$local:meta])* fn local_comm_id;
        $(#[$remote:meta])* fn remote_comm_id;
        $(#[$repr:meta])* Repr $a_name:literal {
            $( $(#[$field_doc:meta])* $field:ident: $field_ty:ty => $setter:ident, )*
        }
        $( Display $format:literal; )?
    ) => {
        cm_packet! {
            $(#[$view])* Packet $name;
            $(#[$private])* fn private_data;
            $(#[$local])* fn local_comm_id;
            $(#[$remote])* fn remote_comm_id;
        }

        $(#[$repr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Repr<'a> {
            /// Local Communication ID (the sender's).
            pub local_comm_id: u32,
            /// Remote Communication ID (the receiver's).
            pub remote_comm_id: u32,
            $( $(#[$field_doc])* pub $field: $field_ty, )*
            /// Private data, at most [`PRIVATE_DATA_LEN`] bytes (the whole area when parsed).
            pub private_data: &'a [u8],
        }

        impl<'a> Repr<'a> {
            #[doc = concat!("Parses ", $a_name, " body.")]
            ///
            /// # Errors
            /// [`ParseError::Truncated`](crate::wire::ParseError::Truncated) if
            /// shorter than 232 bytes.
            pub fn parse<T: AsRef<[u8]> + ?Sized>(
                packet: &Packet<&'a T>,
            ) -> Result<Repr<'a>, $crate::wire::ParseError> {
                packet.check_len()?;
                let buffer: &'a [u8] = packet.buffer.as_ref();
                Ok(Repr {
                    local_comm_id: packet.local_comm_id(),
                    remote_comm_id: packet.remote_comm_id(),
                    $( $field: packet.$field(), )*
                    private_data: &buffer[field::PRIVATE_DATA],
                })
            }

            #[doc = concat!("Writes the ", $name, " body.")]
            ///
            /// # Panics
            /// If the buffer is shorter than 232 bytes or `private_data` is longer than
            /// [`PRIVATE_DATA_LEN`].
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
                packet.set_local_comm_id(self.local_comm_id);
                packet.set_remote_comm_id(self.remote_comm_id);
                $( packet.$setter(self.$field); )*
                $crate::wire::cm::emit_private_data(packet.private_data_mut(), self.private_data);
            }
        }

        impl ::core::fmt::Display for Repr<'_> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                write!(
                    f,
                    concat!("CM ", $name, " lcomm={:#010x} rcomm={:#010x}" $(, $format)?),
                    self.local_comm_id,
                    self.remote_comm_id,
                    $( self.$field, )*
                )
            }
        }
    };
}

//! Error types, one per operation, each variant named after the broken rule.
//!
//! All are `Copy`, allocation-free and `#[non_exhaustive]`; each implements
//! `Display` and `core::error::Error`.

use core::fmt;

macro_rules! error_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[doc = $doc:literal])* $variant:ident => $message:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self {
                    $( Self::$variant => $message, )*
                })
            }
        }

        impl core::error::Error for $name {}
    };
}

error_enum! {
    /// A checked access to registered memory was refused.
    pub enum AccessError {
        /// The handle names a buffer that was freed, or never existed.
        StaleHandle => "stale memory handle",
        /// The byte range does not lie inside the handle, SGE or region.
        OutOfBounds => "access out of bounds",
        /// No region currently carries this key (unknown, deregistered,
        /// invalidated or re-keyed since).
        InvalidKey => "invalid memory key",
        /// The region's access flags lack the right this access needs.
        AccessDenied => "access right not granted",
    }
}

error_enum! {
    /// Allocating a buffer from the pool failed.
    pub enum AllocError {
        /// A zero-length buffer was requested.
        ZeroLength => "zero-length allocation",
        /// The alignment is not a power of two.
        BadAlignment => "alignment is not a power of two",
        /// No free range of the pool is large enough.
        OutOfMemory => "memory pool exhausted",
        /// The region table has no free slot.
        TableFull => "region table full",
    }
}

error_enum! {
    /// Registering, re-keying, invalidating, deregistering or freeing failed.
    pub enum RegError {
        /// The handle names a buffer that was freed, or never existed.
        StaleHandle => "stale memory handle",
        /// The handle covers only part of its buffer; registration is per
        /// whole buffer.
        PartialBuffer => "handle does not cover its whole buffer",
        /// The buffer is already registered.
        AlreadyRegistered => "buffer already registered",
        /// The access flags are not a valid set (remote write without
        /// local write).
        InvalidAccess => "invalid access flags",
        /// The key names no current registration (or, for invalidation, no
        /// currently valid rkey).
        InvalidKey => "invalid memory key",
        /// Posted work requests still pin the region; retry after their
        /// completions.
        Busy => "region pinned by in-flight work requests",
        /// The provider cannot do this at all (re-keying on a userspace
        /// verbs provider, which has no fast-register work request).
        Unsupported => "not supported by this provider",
    }
}

error_enum! {
    /// Posting work requests failed; nothing of the list was posted.
    pub enum PostError {
        /// The send or receive queue has no room for the whole list.
        QueueFull => "work queue full",
        /// More scatter-gather entries than `MAX_SGE`.
        TooManySge => "too many scatter-gather entries",
        /// The scatter-gather list is longer than 2^32 - 1 bytes in total.
        LengthOverflow => "scatter-gather list too long",
        /// More bytes than `MAX_INLINE` to carry in the request itself.
        InlineTooLong => "inline payload longer than MAX_INLINE",
        /// A scatter-gather entry's lkey names no current registration.
        InvalidKey => "invalid local key",
        /// A scatter-gather entry lies outside its region.
        OutOfBounds => "scatter-gather entry out of bounds",
        /// A region lacks the right the request needs (local write for
        /// receive buffers and RDMA READ destinations).
        AccessDenied => "local access right not granted",
        /// No such connection.
        UnknownConnection => "unknown connection",
        /// The connection cannot take work requests in its current state.
        NotConnected => "connection not ready for work requests",
        /// The provider cannot execute this operation (LOCAL_INV on a
        /// userspace verbs provider).
        Unsupported => "operation not supported by this provider",
    }
}

impl From<AccessError> for PostError {
    fn from(error: AccessError) -> Self {
        match error {
            AccessError::StaleHandle | AccessError::InvalidKey => Self::InvalidKey,
            AccessError::OutOfBounds => Self::OutOfBounds,
            AccessError::AccessDenied => Self::AccessDenied,
        }
    }
}

error_enum! {
    /// A connection-management call failed.
    pub enum ConnectError {
        /// No such connection.
        UnknownConnection => "unknown connection",
        /// The call is not allowed in the connection's current state
        /// (accepting twice, disconnecting before a reply, ...).
        InvalidState => "operation not allowed in this connection state",
        /// The private data exceeds what the CM message carries.
        PrivateDataTooLong => "private data too long",
        /// The connection or listener table is full.
        NoResources => "no free connection slot",
        /// Another listener already holds the port.
        PortInUse => "port already in use",
        /// The address family or address is not served by this provider.
        AddressUnsupported => "address not supported",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_conversion() {
        assert_eq!(
            std::format!("{}", RegError::Busy),
            "region pinned by in-flight work requests"
        );
        assert_eq!(
            PostError::from(AccessError::StaleHandle),
            PostError::InvalidKey
        );
        assert_eq!(
            PostError::from(AccessError::AccessDenied),
            PostError::AccessDenied
        );
    }
}

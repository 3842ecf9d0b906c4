//! Brick's software RoCEv2 HCA (sans-IO): wire, RC queue pairs, CM, ARP.
//!
//! The crate is layered like smoltcp: [`wire`] holds zero-copy `Packet<T>` views and
//! validated `Repr`s for every header Brick puts on or takes off the wire (Ethernet,
//! ARP, IPv4, UDP, the InfiniBand transport headers, the GSI MAD, IB CM and the RDMA
//! CM private-data header), the RoCEv2 ICRC, a whole-frame parser/emitter for the
//! transport, and a [`wire::PrettyPrinter`] for debugging and golden tests. [`types`]
//! holds the spec-named integers (PSN, QPN, keys, GID, MTU) that the transport and the
//! `verbs` crate share. [`qp`] is the RC transport (requester and responder,
//! go-back-N retransmission, RNR, key checks), [`hca::Hca`] the software HCA that
//! owns the registered memory, the QP table, the completion queue (all sized
//! at run time by a [`HcaCapacity`], [`capacity`]), the [`cm`]
//! connection manager (IB CM + RDMA CM on QP1) and the [`arp`] neighbour table,
//! and implements `verbs::Verbs` including connection management (`listen`,
//! `connect`, `accept`, `reject`, `disconnect`, `poll_cm_event`). [`udp`] is the
//! HCA's UDP mode: the IB part of each packet over a host UDP socket, the ICRC
//! over a canonical pseudo IPv4/UDP header (Brick to Brick).
//!
//! Specs: `docs/protocol/roce-v2.md` (RoCEv2 and RC/UD as Linux rxe speaks them) and
//! `docs/protocol/ib-cm.md` (IB CM and RDMA CM).
//!
//! # Features
//! - `std`: host-only helpers, today the `pcap` reader and writer used by the tests
//!   and the lossy-link relay.
//!
//! # Fuzzing
//! Under `cfg(fuzzing)` every checksum check (ICRC, IPv4 header checksum, non-zero UDP
//! checksum) succeeds, so that fuzzers reach the parsers behind them.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod arp;
pub mod capacity;
pub mod cm;
pub mod hca;
#[cfg(feature = "std")]
pub mod pcap;
pub mod qp;
pub mod slots;
pub mod types;
pub mod udp;
pub mod wake;
pub mod wire;

pub use capacity::HcaCapacity;

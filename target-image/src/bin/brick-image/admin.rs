//! The admin endpoint in the image's loop (docs/ADMIN.md): the manifest's
//! `[admin]` address served over smoltcp TCP on the interface that has it
//! ([`target_image::admin_tcp`]). The loop offers every received frame
//! ([`Admin::take`]: TCP to the admin address is the endpoint's alone),
//! polls the endpoint after the engine ([`Admin::poll`]: its frames go
//! out on that interface's NIC) and counts its deadline in its halts
//! ([`Admin::poll_at`]). Without `[admin]` every call returns at once.

use hal::block::Either;
use hal::Nic;
use manifest::binary::Manifest;
use target_image::admin_tcp::AdminTcp;
use target_image::{Engine, Port, RamOr};

use crate::port::ExitCode;
use crate::serve::{Net, Volume};
use crate::thin_pools::Thin;

/// The endpoint, if the manifest has one.
pub struct Admin(Option<AdminTcp>);

impl Admin {
    /// Opens the endpoint `manifest` names (logged); exits with
    /// [`ExitCode::BadManifest`] if its address is no interface's.
    pub fn open(manifest: &Manifest<'_>, now: u64) -> Self {
        let mut rng = crate::rng::Source::detect();
        let seed =
            u64::from(hal::Rng::next_u32(&mut rng)) << 32 | u64::from(hal::Rng::next_u32(&mut rng));
        match AdminTcp::new(manifest, seed, now) {
            Ok(Some(tcp)) => {
                let interface = manifest.interfaces().nth(tcp.interface());
                log!(
                    "admin endpoint http://{} on interface {} (TCP over smoltcp, {} connections)",
                    tcp.admin(),
                    interface.map_or("?", |i| i.name),
                    target_image::admin_tcp::MAX_CONNECTIONS
                );
                Admin(Some(tcp))
            }
            Ok(None) => Admin(None),
            Err(error) => {
                log!("FATAL: {error}");
                crate::port::exit(ExitCode::BadManifest)
            }
        }
    }

    /// Offers a frame received on `interface`: `true` if it was the
    /// endpoint's alone (do not give it to the engine).
    pub fn take(&mut self, interface: usize, frame: &[u8]) -> bool {
        self.0
            .as_mut()
            .is_some_and(|tcp| tcp.receive(interface, frame))
    }

    /// Runs the endpoint once (a snapshot of `engine` if a request is
    /// due), sending on its interface's NIC; whether anything happened.
    pub fn poll<P: Port>(
        &mut self,
        now: u64,
        engine: &Engine<'_, P, Volume>,
        nics: &mut [Net],
    ) -> bool {
        let Some(tcp) = self.0.as_mut() else {
            return false;
        };
        let Some(nic) = nics.get_mut(tcp.interface()) else {
            return false;
        };
        tcp.poll(
            now,
            engine,
            &thin_of,
            // Drops (a full ring) are recovered by TCP.
            &mut |frame| {
                let _ = nic.transmit(frame, &[]);
            },
            &mut |line| log!("{line}"),
        )
    }

    /// When [`poll`](Self::poll) next has work (`None`: only a frame).
    pub fn poll_at(&mut self, now: u64) -> Option<u64> {
        self.0.as_mut().and_then(|tcp| tcp.poll_at(now))
    }
}

/// A volume's thin view (`None`: RAM or a whole disk).
fn thin_of(volume: &Volume) -> Option<&Thin> {
    match volume {
        RamOr::Device(device) => match &**device {
            Either::Right(thin) => Some(thin),
            Either::Left(_) => None,
        },
        RamOr::Ram(_) => None,
    }
}

//! `[admin]`: the hosted target's admin endpoint (HTTP `/metrics` and
//! extent lists) and the networks allowed to reach it.

use std::net::SocketAddrV4;

use serde::Deserialize;
use toml::Spanned;

use super::{Compiler, Result};
use crate::binary::{Admin, MAX_ADMIN_SOURCES};
use crate::types::Ipv4Cidr;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    address: Spanned<String>,
    sources: Spanned<Vec<Spanned<String>>>,
}

impl Compiler<'_> {
    /// The admin endpoint: `address = "IP:PORT"` (port nonzero) and
    /// `sources`, 1..=8 networks (a bare address is a /32).
    pub(super) fn admin(&self, raw: Option<&Spanned<RawAdmin>>) -> Result<Option<Admin>> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        let raw = raw.get_ref();
        let text = raw.address.get_ref();
        let address: SocketAddrV4 = text.parse().map_err(|_| {
            self.at(
                &raw.address,
                "admin.address",
                format!(
                    "expected an IPv4 address and port like \"127.0.0.1:9100\", found {text:?}"
                ),
            )
        })?;
        if address.port() == 0 {
            return Err(self.at(&raw.address, "admin.address", "port 0 is not a listen port"));
        }
        let list = raw.sources.get_ref();
        if list.is_empty() || list.len() > MAX_ADMIN_SOURCES {
            return Err(self.at(
                &raw.sources,
                "admin.sources",
                format!(
                    "{} sources, expected 1..={MAX_ADMIN_SOURCES} networks allowed to connect",
                    list.len()
                ),
            ));
        }
        let mut sources = Vec::with_capacity(list.len());
        for (i, source) in list.iter().enumerate() {
            let cidr = Ipv4Cidr::parse(source.get_ref(), Some(32)).ok_or_else(|| {
                self.at(
                    source,
                    format!("admin.sources[{i}]"),
                    format!(
                        "expected an IPv4 address or network like \"127.0.0.1\" or \"10.0.0.0/8\", found {:?}",
                        source.get_ref()
                    ),
                )
            })?;
            sources.push(cidr);
        }
        Ok(Admin::new(address, &sources))
    }
}

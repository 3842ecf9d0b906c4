//! What the admin plane renders (docs/ADMIN.md), for the hosted target
//! and the image alike: `/metrics` (the engine's metrics and the admin
//! endpoint's own counters) and a thin volume's extent list as JSON,
//! written through [`core::fmt`] into a [`FixedText`] allocated at start.
//!
//! Thin volumes are found through a function from the engine's device
//! type to a [`thin::ThinVolume`] (`None`: not thin), so one rendering
//! serves the hosted devices and the image's alike.

use core::fmt::{self, Write};

use hal::block::BlockDevice;
use manifest::binary::Manifest;
use thin::{PoolBuf, ThinVolume};

use crate::admin_http::ErrorAnswer;
use crate::metrics::family;
use crate::{Chunk, Engine, FixedText, Port, ThinGauges};

/// What the admin endpoint asks the engine for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminRequest {
    /// Every metric (`GET /metrics`).
    Metrics,
    /// Volume `index`'s allocated extents (`GET /volumes/NAME/extents`).
    Extents(usize),
}

/// How the engine answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAnswer {
    /// The text is complete.
    Done,
    /// The text did not fit the snapshot buffer.
    Overflow,
    /// The volume is not thin: it has no extents (the text is the JSON
    /// error).
    NotThin,
    /// No such volume.
    NoVolume,
}

/// The admin endpoint's own counters, rendered with `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdminCounters {
    /// Connections closed at accept: source not allowed.
    pub refused: u64,
    /// Requests the engine was asked to answer.
    pub requests: u64,
}

/// Bytes of the snapshot buffer for `manifest`: room for every metric
/// with every session and path open, and for long extent lists (counted
/// by `brick manifest check`: [`manifest::capacity::admin_snapshot_bytes`]).
pub fn snapshot_capacity(manifest: &Manifest<'_>) -> usize {
    let bytes =
        manifest::capacity::admin_snapshot_bytes(&manifest.limits(), manifest.volume_count());
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// A thin volume's gauges.
pub fn thin_gauges<TD: BlockDevice<PoolBuf<H>>, H: Copy>(thin: &ThinVolume<TD, H>) -> ThinGauges {
    let pool = thin.pool();
    ThinGauges {
        allocated_extents: u64::from(thin.allocated()),
        pool_extents: u64::from(pool.extent_count()),
        pool_free_extents: u64::from(pool.free_extents()),
        pool_enospc: pool.stats().enospc,
    }
}

/// Renders `request` into `out` (cleared first): `thin(device)` is a
/// volume's thin view (`None`: not thin). Allocates nothing; a text that
/// does not fit is [`AdminAnswer::Overflow`].
pub fn render<P, D, TD, H>(
    engine: &Engine<'_, P, D>,
    request: AdminRequest,
    thin: &dyn Fn(&D) -> Option<&ThinVolume<TD, H>>,
    counters: AdminCounters,
    out: &mut FixedText,
) -> AdminAnswer
where
    P: Port,
    D: BlockDevice<Chunk>,
    TD: BlockDevice<PoolBuf<H>>,
    H: Copy,
{
    out.clear();
    let written = match request {
        AdminRequest::Metrics => write_all_metrics(engine, thin, counters, out),
        AdminRequest::Extents(index) => write_extents(engine, index, thin, out),
    };
    written.unwrap_or(AdminAnswer::Overflow)
}

fn write_all_metrics<P, D, TD, H>(
    engine: &Engine<'_, P, D>,
    thin: &dyn Fn(&D) -> Option<&ThinVolume<TD, H>>,
    counters: AdminCounters,
    out: &mut FixedText,
) -> Result<AdminAnswer, fmt::Error>
where
    P: Port,
    D: BlockDevice<Chunk>,
    TD: BlockDevice<PoolBuf<H>>,
    H: Copy,
{
    engine.write_metrics(out, &|device| thin(device).map(thin_gauges))?;
    let name = "brick_admin_connections_refused_total";
    family(
        out,
        name,
        "counter",
        "Admin connections closed at accept: source not allowed.",
    )?;
    writeln!(out, "{name} {}", counters.refused)?;
    let name = "brick_admin_requests_total";
    family(
        out,
        name,
        "counter",
        "Admin requests the engine was asked to answer.",
    )?;
    writeln!(out, "{name} {}", counters.requests)?;
    Ok(AdminAnswer::Done)
}

/// Volume `index`'s allocated extents as JSON ranges of consecutive
/// virtual extents (see docs/ADMIN.md), or why there are none.
fn write_extents<P, D, TD, H>(
    engine: &Engine<'_, P, D>,
    index: usize,
    thin: &dyn Fn(&D) -> Option<&ThinVolume<TD, H>>,
    out: &mut FixedText,
) -> Result<AdminAnswer, fmt::Error>
where
    P: Port,
    D: BlockDevice<Chunk>,
    TD: BlockDevice<PoolBuf<H>>,
    H: Copy,
{
    let Some(volume) = engine.volume(index) else {
        return Ok(AdminAnswer::NoVolume);
    };
    let name = engine.manifest().volume(index).map_or("", |v| v.name);
    let Some(thin) = thin(volume) else {
        write!(out, "{}", ErrorAnswer::not_thin(name))?;
        return Ok(AdminAnswer::NotThin);
    };
    let pool = thin.pool();
    let size = u64::from(pool.extent_size());
    write!(
        out,
        "{{\"volume\":\"{}\",\"extent_size\":{size},\"allocated_extents\":{},\"pool_extents\":{},\"pool_free_extents\":{},\"ranges\":[",
        Json(name),
        thin.allocated(),
        pool.extent_count(),
        pool.free_extents()
    )?;
    let mut result = Ok(());
    let mut first = true;
    let mut run: Option<(u32, u32)> = None;
    let emit = |out: &mut FixedText, (start, count): (u32, u32), first: &mut bool| {
        let comma = if core::mem::take(first) { "" } else { "," };
        write!(
            out,
            "{comma}{{\"first_extent\":{start},\"extents\":{count},\"offset\":{},\"length\":{}}}",
            u64::from(start) * size,
            u64::from(count) * size
        )
    };
    thin.extents(|virtual_extent, _| {
        match run {
            Some((start, count)) if start + count == virtual_extent => {
                run = Some((start, count + 1));
                return;
            }
            Some(done) if result.is_ok() => result = emit(out, done, &mut first),
            _ => {}
        }
        run = Some((virtual_extent, 1));
    });
    result?;
    if let Some(done) = run {
        emit(out, done, &mut first)?;
    }
    out.write_str("]}")?;
    Ok(AdminAnswer::Done)
}

/// A JSON string's contents, escaped.
pub(crate) struct Json<'a>(pub(crate) &'a str);

impl fmt::Display for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

//! Reading callgrind's output: instructions (`Ir`) per function, calls
//! between functions, and the layer of Brick each function belongs to.
//!
//! The format (valgrind's "Callgrind Format Specification"): `fn=` opens a
//! function's cost lines (`POSITION... COST...`); `cfn=` and `calls=COUNT
//! TARGET` introduce a call from it, whose next cost line is the call's
//! inclusive cost (not the caller's own); names may be compressed as
//! `(ID) name` the first time and `(ID)` after. [`Profile::parse`] sums
//! every function's self cost and every caller-callee pair's calls.
//!
//! [`layer`] attributes a function by its demangled Rust path: the crate
//! (the lib names `roce`, `rtrs`, `rnbd`, `target_image`, `hal`,
//! `verbs`), for `roce` the module (`roce::wire`, `roce::qp`), for a trait
//! method `<Type as Trait>::f` the type's crate, and for libc's
//! `memcpy`/`memmove`/`memset` variants and `crc32fast` the copy and CRC
//! columns.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;

/// Where a function's instructions are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layer {
    /// `roce::wire` (headers, ICRC framing) and the `smoltcp` views it uses.
    Wire,
    /// `roce::qp`: requester, responder.
    Qp,
    /// The rest of `roce` (CM, ARP, the HCA) and `verbs` (the registered
    /// memory arena, the provider seam).
    Hca,
    /// `rtrs`.
    Rtrs,
    /// `rnbd`.
    Rnbd,
    /// `target_image` (the engine, its RAM volumes) and `manifest`.
    Engine,
    /// `hal` and the probe's link (the frame copy a NIC driver does).
    Link,
    /// Everything else: `core`, `alloc`, `heapless`, libc besides copies.
    Other,
    /// libc's `memcpy`, `memmove`, `memset` (every variant).
    Copy,
    /// `crc32fast` (the ICRC).
    Crc,
}

impl Layer {
    /// Every layer, in table order.
    pub const ALL: [Layer; 10] = [
        Layer::Wire,
        Layer::Qp,
        Layer::Hca,
        Layer::Rtrs,
        Layer::Rnbd,
        Layer::Engine,
        Layer::Link,
        Layer::Other,
        Layer::Copy,
        Layer::Crc,
    ];

    /// The column name.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Wire => "wire/ICRC",
            Layer::Qp => "QP",
            Layer::Hca => "CM/HCA",
            Layer::Rtrs => "RTRS",
            Layer::Rnbd => "RNBD",
            Layer::Engine => "engine",
            Layer::Link => "link",
            Layer::Other => "other",
            Layer::Copy => "copy",
            Layer::Crc => "CRC",
        }
    }

    /// Copies and CRC: what the goal of 3,000 per IO is "beyond".
    pub fn is_copy_or_crc(self) -> bool {
        matches!(self, Layer::Copy | Layer::Crc)
    }
}

/// libc's copy and fill routines (`__memcpy_avx_unaligned_erms`,
/// `memmove@@GLIBC_2.2.5`, ...): C symbols, no Rust path.
pub fn is_copy_symbol(name: &str) -> bool {
    !name.contains("::")
        && ["memcpy", "memmove", "memset", "mempcpy"]
            .iter()
            .any(|m| name.contains(m))
}

/// The path a function is attributed by: a trait method's type, a
/// `drop_in_place`'s dropped type, leading `<`, `&`, `mut `, `dyn ` off.
fn subject(name: &str) -> &str {
    let mut s = name;
    loop {
        let before = s;
        for prefix in ["<", "&", "mut ", "dyn ", "*const ", "*mut "] {
            s = s.strip_prefix(prefix).unwrap_or(s);
        }
        if let Some(inner) = s.strip_prefix("core::ptr::drop_in_place") {
            s = inner;
        }
        if s == before {
            return s;
        }
    }
}

/// The layer of the function `name` (a demangled symbol).
pub fn layer(name: &str) -> Layer {
    if is_copy_symbol(name) {
        return Layer::Copy;
    }
    let path = subject(name);
    let krate = path.split("::").next().unwrap_or("");
    if krate.starts_with("crc32fast") {
        return Layer::Crc;
    }
    match krate {
        "roce" if path.starts_with("roce::wire::") => Layer::Wire,
        "roce" if path.starts_with("roce::qp::") => Layer::Qp,
        "roce" | "verbs" => Layer::Hca,
        "smoltcp" => Layer::Wire,
        "rtrs" => Layer::Rtrs,
        "rnbd" => Layer::Rnbd,
        "target_image" | "manifest" => Layer::Engine,
        "hal" | "cost_probe" => Layer::Link,
        _ => Layer::Other,
    }
}

/// One parsed callgrind profile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Self `Ir` per function.
    pub self_cost: BTreeMap<String, i64>,
    /// Calls per (caller, callee).
    pub calls: BTreeMap<(String, String), i64>,
    /// Inclusive cost of those calls.
    pub call_cost: BTreeMap<(String, String), i64>,
}

/// A compressed name table (`(ID) name` defines, `(ID)` refers).
#[derive(Default)]
struct Names(BTreeMap<String, String>);

impl Names {
    fn resolve(&mut self, text: &str) -> Result<String> {
        let text = text.trim();
        let Some(rest) = text.strip_prefix('(') else {
            return Ok(text.to_string());
        };
        let (id, name) = rest
            .split_once(')')
            .with_context(|| format!("expected `(ID) name`, found {text:?}"))?;
        let name = name.trim();
        if name.is_empty() {
            self.0
                .get(id)
                .cloned()
                .with_context(|| format!("name ({id}) used before it was defined"))
        } else {
            self.0.insert(id.to_string(), name.to_string());
            Ok(name.to_string())
        }
    }
}

impl Profile {
    /// Parses callgrind output with an `Ir` event.
    ///
    /// # Errors
    /// When the text is not callgrind output (no `events:` line naming
    /// `Ir`) or a line does not parse.
    pub fn parse(text: &str) -> Result<Profile> {
        let mut profile = Profile::default();
        let mut names = Names::default();
        let (mut positions, mut ir_column) = (1usize, None);
        let mut function = String::new();
        let mut callee: Option<String> = None;
        // The call whose inclusive cost is the next cost line.
        let mut in_call: Option<(String, String)> = None;
        let mut summary: Option<i64> = None;
        for (number, line) in text.lines().enumerate() {
            let at = || format!("callgrind output line {}: {line:?}", number + 1);
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let first = line.as_bytes()[0];
            if first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'*') {
                let column =
                    ir_column.with_context(|| format!("{}: cost before `events:`", at()))?;
                let cost: i64 = match line.split_whitespace().nth(positions + column) {
                    Some(word) => word.parse().with_context(at)?,
                    None => 0, // trailing zero costs may be left out
                };
                if let Some(pair) = in_call.take() {
                    *profile.call_cost.entry(pair).or_default() += cost;
                } else {
                    *profile.self_cost.entry(function.clone()).or_default() += cost;
                }
                continue;
            }
            let Some((key, value)) = line.split_once('=').or_else(|| line.split_once(':')) else {
                bail!("{}: expected `key=value` or a cost line", at());
            };
            match key {
                "fn" => function = names.resolve(value).with_context(at)?,
                "cfn" => callee = Some(names.resolve(value).with_context(at)?),
                "calls" => {
                    let count: i64 = value
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .parse()
                        .with_context(at)?;
                    let target = callee
                        .take()
                        .with_context(|| format!("{}: no cfn=", at()))?;
                    let pair = (function.clone(), target);
                    *profile.calls.entry(pair.clone()).or_default() += count;
                    in_call = Some(pair);
                }
                "summary" | "totals" => {
                    let column = ir_column.unwrap_or(0);
                    let word = value.split_whitespace().nth(column).unwrap_or("0");
                    summary = Some(word.parse().with_context(at)?);
                }
                "positions" => positions = value.split_whitespace().count(),
                "events" => {
                    ir_column = value.split_whitespace().position(|e| e == "Ir");
                    if ir_column.is_none() {
                        bail!("{}: expected an Ir event", at());
                    }
                }
                // Files (`fl`, `fi`, `fe`, `cfi`, `cfl`), objects (`ob`,
                // `cob`) and headers have name tables of their own, which
                // attribution by function name does not need.
                _ => {}
            }
        }
        if ir_column.is_none() {
            bail!("not callgrind output: no `events:` line");
        }
        let total: i64 = profile.self_cost.values().sum();
        if let Some(summary) = summary.filter(|&s| s != total) {
            bail!("self costs sum to {total} Ir, the file's summary says {summary}");
        }
        Ok(profile)
    }

    /// `self - base`, function by function (the cost of what `self` ran
    /// beyond `base`).
    pub fn minus(&self, base: &Profile) -> Profile {
        let mut out = self.clone();
        for (name, cost) in &base.self_cost {
            *out.self_cost.entry(name.clone()).or_default() -= cost;
        }
        for (pair, count) in &base.calls {
            *out.calls.entry(pair.clone()).or_default() -= count;
        }
        for (pair, cost) in &base.call_cost {
            *out.call_cost.entry(pair.clone()).or_default() -= cost;
        }
        out
    }

    /// Self cost summed per layer.
    pub fn by_layer(&self) -> BTreeMap<Layer, i64> {
        let mut out: BTreeMap<Layer, i64> = Layer::ALL.iter().map(|&l| (l, 0)).collect();
        for (name, cost) in &self.self_cost {
            *out.entry(layer(name)).or_default() += cost;
        }
        out
    }

    /// Calls made to functions `pick` accepts (from any caller).
    pub fn calls_to(&self, pick: impl Fn(&str) -> bool) -> i64 {
        self.calls
            .iter()
            .filter(|((_, callee), _)| pick(callee))
            .map(|(_, count)| count)
            .sum()
    }

    /// Callers of functions `pick` accepts, by the inclusive cost of
    /// those calls, most first: (caller, calls, cost).
    pub fn callers_of(&self, pick: impl Fn(&str) -> bool) -> Vec<(String, i64, i64)> {
        let mut by_caller: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for ((caller, callee), count) in &self.calls {
            if pick(callee) {
                let cost = self.call_cost.get(&(caller.clone(), callee.clone()));
                let entry = by_caller.entry(caller).or_default();
                entry.0 += count;
                entry.1 += cost.copied().unwrap_or(0);
            }
        }
        let mut list: Vec<(String, i64, i64)> = by_caller
            .into_iter()
            .map(|(caller, (count, cost))| (caller.to_string(), count, cost))
            .collect();
        list.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        list
    }

    /// The `count` functions of most self cost outside copies and CRC.
    pub fn top(&self, count: usize) -> Vec<(String, i64)> {
        let mut list: Vec<(String, i64)> = self
            .self_cost
            .iter()
            .filter(|(name, _)| !layer(name).is_copy_or_crc())
            .map(|(name, cost)| (name.clone(), *cost))
            .collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        list.truncate(count);
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from a callgrind 3.19 run of the probe (cut down): name
    /// compression, relative positions, calls with inclusive costs.
    const SAMPLE: &str = "# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 686

ob=(3) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(181) ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S
fn=(944) __memcpy_avx_unaligned_erms
264 60
+6 40

ob=(1) /work/wt-hca/target/release/examples/cost_probe
fl=(2) ???
fn=(1668) cost_probe::target_side
0 20
cfn=(1672) roce::hca::Hca<S,K,_,_,_>::receive
calls=3 0 
0 500
0 5
cfn=(1682) target_image::engine::Engine<K,D>::poll
calls=4 0 
0 400

fn=(1672)
0 300
cfn=(944)
calls=2 0
0 100
fn=(1700) <roce::hca::Hca<S,K,_,_,_> as verbs::provider::Verbs>::poll_cq
* 7
fn=(1682)
0 150
fn=(1701) roce::qp::requester::<impl roce::qp::Qp>::post_send
0 11
fn=(1702) crc32fast::specialized::pclmulqdq::calculate
0 90
fn=(1703) core::ptr::drop_in_place<rtrs::server::Server<V>>
0 3
";

    #[test]
    fn parses_self_costs_and_calls() {
        let p = Profile::parse(SAMPLE).unwrap();
        assert_eq!(p.self_cost["__memcpy_avx_unaligned_erms"], 100);
        // 20 + 5: the 500 and 400 are the calls' inclusive costs.
        assert_eq!(p.self_cost["cost_probe::target_side"], 25);
        assert_eq!(p.self_cost["roce::hca::Hca<S,K,_,_,_>::receive"], 300);
        assert_eq!(p.self_cost["target_image::engine::Engine<K,D>::poll"], 150);
        let key = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            p.calls[&key(
                "cost_probe::target_side",
                "target_image::engine::Engine<K,D>::poll"
            )],
            4
        );
        assert_eq!(p.calls_to(is_copy_symbol), 2);
        assert_eq!(
            p.callers_of(is_copy_symbol),
            vec![("roce::hca::Hca<S,K,_,_,_>::receive".to_string(), 2, 100)]
        );
        assert_eq!(
            p.call_cost[&key(
                "cost_probe::target_side",
                "roce::hca::Hca<S,K,_,_,_>::receive"
            )],
            500
        );
        let total: i64 = p.self_cost.values().sum();
        assert_eq!(total, 100 + 25 + 300 + 7 + 150 + 11 + 90 + 3);
    }

    #[test]
    fn attributes_layers_by_rust_path() {
        let cases = [
            ("__memcpy_avx_unaligned_erms", Layer::Copy),
            ("__memset_avx2_unaligned_erms", Layer::Copy),
            ("memmove@@GLIBC_2.2.5", Layer::Copy),
            ("crc32fast::baseline::update_fast_16", Layer::Crc),
            ("roce::wire::frame::RoceFrame::parse", Layer::Wire),
            ("smoltcp::wire::ip::checksum::data", Layer::Wire),
            (
                "roce::qp::requester::<impl roce::qp::Qp>::post_send",
                Layer::Qp,
            ),
            ("roce::cm::machine::Cm<_>::poll_event", Layer::Hca),
            (
                "<roce::hca::Hca<S,K,_,_,_> as verbs::provider::Verbs>::poll_cq",
                Layer::Hca,
            ),
            ("verbs::memory::arena::Arena<S,_>::alloc", Layer::Hca),
            ("rtrs::server::Server<V>::poll", Layer::Rtrs),
            (
                "core::ptr::drop_in_place<rtrs::server::Server<V>>",
                Layer::Rtrs,
            ),
            ("rnbd::server::Server::process", Layer::Rnbd),
            (
                "target_image::engine::Engine<K,D>::poll::{{closure}}",
                Layer::Engine,
            ),
            ("hal::block::something", Layer::Link),
            ("cost_probe::link::transmit", Layer::Link),
            (
                "<&mut F as core::ops::function::FnMut<A>>::call_mut",
                Layer::Other,
            ),
            ("core::slice::memchr::memchr_aligned", Layer::Other),
            ("malloc", Layer::Other),
        ];
        for (name, want) in cases {
            assert_eq!(layer(name), want, "{name}");
        }
    }

    #[test]
    fn difference_and_layers() {
        let small = Profile::parse(SAMPLE).unwrap();
        let doubled = SAMPLE
            .replace("fn=(1682)\n0 150", "fn=(1682)\n0 450")
            .replace("summary: 686", "summary: 986");
        let big = Profile::parse(&doubled).unwrap();
        let diff = big.minus(&small);
        assert_eq!(
            diff.self_cost["target_image::engine::Engine<K,D>::poll"],
            300
        );
        assert_eq!(diff.self_cost["roce::hca::Hca<S,K,_,_,_>::receive"], 0);
        let layers = small.by_layer();
        assert_eq!(layers[&Layer::Hca], 307);
        assert_eq!(layers[&Layer::Copy], 100);
        assert_eq!(layers[&Layer::Crc], 90);
        assert_eq!(layers[&Layer::Link], 25);
        let top = small.top(2);
        assert_eq!(top[0], ("roce::hca::Hca<S,K,_,_,_>::receive".into(), 300));
        assert_eq!(top[1].1, 150);
    }

    #[test]
    fn rejects_what_is_not_callgrind_output() {
        assert!(Profile::parse("hello world\n").is_err());
        let wrong_sum = SAMPLE.replace("summary: 686", "summary: 687");
        let error = Profile::parse(&wrong_sum).unwrap_err();
        assert!(format!("{error:#}").contains("686"), "{error:#}");
        assert!(Profile::parse("events: Ir\nfn=(1)\n").is_err());
        let error = Profile::parse("events: Dr\n").unwrap_err();
        assert!(format!("{error:#}").contains("Ir"), "{error:#}");
    }
}
